package userapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Every user-interactive auth flow offered here has a single stage.
const (
	stageDummy    = "m.login.dummy"
	stagePassword = "m.login.password"
)

// hash binds a session to the request. Only the hash is stored, since the
// parameters may hold a secret (a new password); the session ID goes into
// it so that equal requests of different sessions hash differently.
func requestHash(r matrixid.AuthRequest, sessionID string) string {
	js, err := json.Marshal([]any{r.UserID, r.Method, r.Path, r.Params})
	if err != nil {
		panic("userapi: user-interactive auth parameters do not marshal: " + err.Error())
	}
	h := sha256.New()
	h.Write([]byte(sessionID))
	h.Write([]byte{0})
	h.Write(js)
	return hex.EncodeToString(h.Sum(nil))
}

// stageFailed is an attempt at a stage that failed: the challenge is
// repeated with the cause as its error.
type stageFailed struct{ cause *mxerr.Error }

func (f stageFailed) Error() string { return f.cause.Error() }

// userInteractive runs the single-stage flow of req. Without auth it answers
// the challenge with a new session bound to req. A session that is unknown,
// expired or already completed gets a new challenge; one started for
// another request is forbidden. auth without a session is attempted at
// once, as clients completing the flow in one request expect. attempt
// checks the stage: a stageFailed repeats the challenge. A completed
// session is deleted, so it completes one request only.
func (s *Service) userInteractive(ctx context.Context, stage string, req matrixid.AuthRequest, auth *matrixid.AuthData, attempt func(*matrixid.AuthData) error) error {
	if auth == nil {
		return s.challenge(ctx, stage, req, "", nil)
	}
	session := auth.Session
	if session != "" {
		sess, err := s.db.UIASession(ctx, session, s.nowMS())
		if errors.Is(err, storage.ErrNotFound) {
			return s.challenge(ctx, stage, req, "", nil)
		}
		if err != nil {
			return err
		}
		bound := sess.RequestHash == requestHash(req, session) ||
			(req.AlsoFrom != nil && sess.RequestHash == requestHash(*req.AlsoFrom, session))
		if sess.UserID != req.UserID || !bound {
			return mxerr.Forbidden("this user-interactive auth session was started for another request")
		}
	}
	if auth.Type != stage {
		return s.challenge(ctx, stage, req, session,
			mxerr.Forbidden("auth type %q is not offered; use %s", auth.Type, stage))
	}
	if err := attempt(auth); err != nil {
		var f stageFailed
		if errors.As(err, &f) {
			return s.challenge(ctx, stage, req, session, f.cause)
		}
		return err
	}
	if session == "" {
		return nil
	}
	done, err := s.db.ConsumeUIASession(ctx, session)
	if err != nil {
		return err
	}
	if !done { // a concurrent request completed it first
		return s.challenge(ctx, stage, req, "", nil)
	}
	return nil
}

// challenge answers 401 with the flow of stage and the session, repeating
// it with cause as the error when cause is not nil. Without a session a new
// one is stored, bound to req.
func (s *Service) challenge(ctx context.Context, stage string, req matrixid.AuthRequest, session string, cause *mxerr.Error) error {
	if session == "" {
		session = newSessionID()
		now := s.now()
		err := s.db.CreateUIASession(ctx, storage.UIASession{
			ID: session, UserID: req.UserID, RequestHash: requestHash(req, session),
			ExpiresTS: now.Add(s.opts.UIASessionLifetime).UnixMilli(),
		}, now.UnixMilli())
		if err != nil {
			return err
		}
	}
	e := &mxerr.Error{Status: http.StatusUnauthorized, Extra: map[string]any{
		"flows":   []any{map[string]any{"stages": []string{stage}}},
		"params":  map[string]any{},
		"session": session,
		// Every flow has one stage, so none is completed while the flow
		// is not; the list is there as clients and Synapse expect it.
		"completed": []string{},
	}}
	if cause != nil {
		e.Code, e.Message = cause.Code, cause.Message
	}
	return e
}

// ConfirmPassword runs the password stage of user-interactive auth for
// req, a request of the caller's made elsewhere (a change of cross-signing
// keys): nil once the caller gave their password.
func (s *Service) ConfirmPassword(ctx context.Context, c matrixid.Caller, req matrixid.AuthRequest, auth *matrixid.AuthData) error {
	return s.userInteractive(ctx, stagePassword, req, auth, s.passwordStage(ctx, c))
}

// passwordStage checks the m.login.password stage for the caller: auth
// naming another user is forbidden; a wrong password fails the stage.
func (s *Service) passwordStage(ctx context.Context, c matrixid.Caller) func(*matrixid.AuthData) error {
	return func(auth *matrixid.AuthData) error {
		user := auth.User
		if auth.Identifier != nil {
			if auth.Identifier.Type != "m.id.user" {
				return stageFailed{mxerr.Forbidden("identifier type %q is not supported", auth.Identifier.Type)}
			}
			user = auth.Identifier.User
		}
		if user == "" {
			user = c.UserID
		}
		if s.resolveUser(user) != c.UserID {
			return mxerr.Forbidden("auth is for another user than the access token's")
		}
		if _, err := s.checkPassword(ctx, c.UserID, auth.Password, c.IP); err != nil {
			var me *mxerr.Error
			if errors.As(err, &me) && me.Status == http.StatusForbidden {
				return stageFailed{me}
			}
			return err
		}
		return nil
	}
}
