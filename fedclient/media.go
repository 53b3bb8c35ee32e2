package fedclient

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/matrix-org/gomatrixserverlib/fclient"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// GetStream sends a signed GET to dest and returns its 2xx answer with
// the body unread, for answers too large to hold in memory (media). The
// caller closes the body; the client's timeout bounds the whole request,
// reading the body included. A non-2xx answer is an *HTTPError.
func (c *Client) GetStream(ctx context.Context, dest, path string) (*http.Response, error) {
	if dest == c.opts.ServerName {
		return nil, fmt.Errorf("refusing to send a federation request to ourselves (%s)", dest)
	}
	d, err := c.acquire(ctx, dest)
	if err != nil {
		return nil, err
	}
	resp, err := c.getStream(ctx, dest, path)
	c.release(dest, d, err)
	return resp, err
}

func (c *Client) getStream(ctx context.Context, dest, path string) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	r := fclient.NewFederationRequest(http.MethodGet, spec.ServerName(c.opts.ServerName), spec.ServerName(dest), path)
	if err := r.Sign(spec.ServerName(c.opts.ServerName), c.opts.KeyID, c.opts.PrivateKey); err != nil {
		cancel()
		return nil, err
	}
	req, err := r.HTTPRequest()
	if err != nil {
		cancel()
		return nil, err
	}
	resp, err := c.http.DoHTTPRequest(ctx, req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("GET %s: %w", dest, err)
	}
	if resp.StatusCode/100 != 2 {
		defer cancel()
		defer resp.Body.Close()
		he := &HTTPError{Destination: dest, Status: resp.StatusCode}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var e struct {
			Errcode string `json:"errcode"`
			Error   string `json:"error"`
		}
		if json.Unmarshal(raw, &e) == nil {
			he.Errcode, he.Message = e.Errcode, e.Error
		}
		return nil, he
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// ErrTooManyRedirects ends a chain of redirects of a URL fetch.
var ErrTooManyRedirects = errors.New("too many redirects")

// URLClient returns an HTTP client for plain http(s) URLs (a media
// redirect's target, a page to preview) that connects only to the
// addresses the client's address policy allows, checked after name
// resolution for every connection, redirects included. No proxy from the
// environment is used: it would connect in the policy's stead.
func (c *Client) URLClient(timeout time.Duration) *http.Client {
	policy := c.opts.AddressPolicy
	dialer := &net.Dialer{Timeout: dialTimeout, Control: (&transport{policy: policy}).control}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         dialer.DialContext,
			TLSHandshakeTimeout: 10 * time.Second,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     time.Minute,
			TLSClientConfig:     &tls.Config{InsecureSkipVerify: c.opts.SkipVerify}, //nolint:gosec // test set-ups only, warned about at start-up
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 5 {
				return ErrTooManyRedirects
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return fmt.Errorf("redirect to a %q URL", req.URL.Scheme)
			}
			return nil
		},
	}
}
