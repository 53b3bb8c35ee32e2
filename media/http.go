package media

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// inlineTypes are the content types served inline: those a browser
// shows without running anything (the spec's list, as Synapse keeps it).
// Everything else is an attachment.
var inlineTypes = map[string]bool{
	"text/css": true, "text/plain": true, "text/csv": true,
	"application/json": true, "application/ld+json": true,
	"image/jpeg": true, "image/gif": true, "image/png": true, "image/apng": true, "image/webp": true, "image/avif": true,
	"video/mp4": true, "video/webm": true, "video/ogg": true, "video/quicktime": true,
	"audio/mp4": true, "audio/webm": true, "audio/aac": true, "audio/mpeg": true, "audio/ogg": true,
	"audio/wave": true, "audio/wav": true, "audio/x-wav": true, "audio/x-pn-wav": true, "audio/flac": true, "audio/x-flac": true,
}

// Disposition is the Content-Disposition of media of a content type and
// file name: inline for the safe types, attachment otherwise; the name
// as a token when it is one, else encoded (RFC 6266 with RFC 5987's
// filename*).
func Disposition(contentType, name string) string {
	kind := "attachment"
	if mt, _, err := mime.ParseMediaType(contentType); err == nil && inlineTypes[mt] {
		kind = "inline"
	}
	if name == "" {
		return kind
	}
	if isToken(name) {
		return kind + "; filename=" + name
	}
	return kind + "; filename*=utf-8''" + rfc5987Escape(name)
}

// isToken reports whether s is an RFC 2616 token.
func isToken(s string) bool {
	for _, c := range []byte(s) {
		if c <= 0x20 || c >= 0x7f || strings.IndexByte(`()<>@,;:\"/[]?={}`, c) >= 0 {
			return false
		}
	}
	return s != ""
}

// rfc5987Escape percent-encodes everything but RFC 5987's attr-char.
func rfc5987Escape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$&+-.^_`|~", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// contentSecurityPolicy keeps media opened in a browser from running
// anything on the server's origin (Synapse's policy).
const contentSecurityPolicy = "sandbox; default-src 'none'; script-src 'none'; plugin-types application/pdf; " +
	"style-src 'unsafe-inline'; media-src 'self'; object-src 'self';"

// SetHeaders sets the headers of a media answer to a client: its type,
// disposition (name overrides the uploaded name when set) and the
// policies that keep a browser from running it.
func SetHeaders(h http.Header, c *Content, name string) {
	if name == "" {
		name = c.UploadName
	}
	h.Set("Content-Type", c.ContentType)
	h.Set("Content-Disposition", Disposition(c.ContentType, name))
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Security-Policy", "sandbox;")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cross-Origin-Resource-Policy", "cross-origin")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "public,max-age=86400,s-maxage=86400")
}

// WriteFederation answers another server's media request: multipart/mixed,
// a JSON part (no metadata: {}) and the content's part.
func WriteFederation(w http.ResponseWriter, c *Content) error {
	var rnd [16]byte
	_, _ = rand.Read(rnd[:])
	boundary := hex.EncodeToString(rnd[:])
	head := "--" + boundary + "\r\nContent-Type: application/json\r\n\r\n{}\r\n" +
		"--" + boundary + "\r\nContent-Type: " + c.ContentType + "\r\nContent-Disposition: " + Disposition(c.ContentType, c.UploadName) + "\r\n\r\n"
	tail := "\r\n--" + boundary + "--\r\n"
	w.Header().Set("Content-Type", "multipart/mixed; boundary="+boundary)
	w.Header().Set("Content-Length", strconv.FormatInt(int64(len(head))+c.Size+int64(len(tail)), 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.WriteString(w, head); err != nil {
		return err
	}
	if _, err := io.CopyN(w, c.File, c.Size); err != nil {
		return err
	}
	_, err := io.WriteString(w, tail)
	return err
}
