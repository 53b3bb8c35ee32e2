package clientapi

import (
	"context"
	"encoding/json"
	"time"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/syncapi"
	"github.com/keyserver/keyserver/syncnotify"
	"github.com/keyserver/keyserver/userapi"
)

// Accounts is what the client API asks of accounts, devices and their
// tokens (package userapi).
type Accounts interface {
	Authenticate(ctx context.Context, token string) (matrixid.Caller, error)
	Available(ctx context.Context, username string) error
	Register(ctx context.Context, r userapi.RegisterRequest) (userapi.LoginResponse, error)
	Login(ctx context.Context, r userapi.LoginRequest) (userapi.LoginResponse, error)
	Logout(ctx context.Context, c matrixid.Caller) error
	LogoutAll(ctx context.Context, c matrixid.Caller) error
	ChangePassword(ctx context.Context, c matrixid.Caller, r userapi.ChangePasswordRequest) error
	Deactivate(ctx context.Context, c matrixid.Caller, r userapi.DeactivateRequest) error
	Device(ctx context.Context, c matrixid.Caller, deviceID string) (userapi.DeviceInfo, error)
	Devices(ctx context.Context, c matrixid.Caller) ([]userapi.DeviceInfo, error)
	RenameDevice(ctx context.Context, c matrixid.Caller, deviceID string, name *string) error
	DeleteDevice(ctx context.Context, c matrixid.Caller, deviceID string, auth *matrixid.AuthData) error
	DeleteDevices(ctx context.Context, c matrixid.Caller, deviceIDs []string, auth *matrixid.AuthData) error
	// Ready reports whether the database answers.
	Ready(ctx context.Context) error
}

// Sync is what the client API asks of /sync and /keys/changes (package
// syncapi).
type Sync interface {
	KeyChanges(ctx context.Context, c matrixid.Caller, from, to string) (syncapi.ChangesResponse, error)
	Sync(ctx context.Context, c matrixid.Caller, since string, timeout time.Duration, o syncapi.SyncOptions) (syncapi.SyncResponse, error)
	SyncOrWait(ctx context.Context, c matrixid.Caller, since string, timeout time.Duration, o syncapi.SyncOptions, wake func(syncnotify.Event)) (syncapi.SyncResponse, *syncapi.SyncWaiter, error)
	// SyncMaxWait is the longest a /sync request waits for news.
	SyncMaxWait() time.Duration
}

// Keys is what the client API asks of end-to-end keys, cross-signing and
// device lists (package keyserver).
type Keys interface {
	UploadKeys(ctx context.Context, c matrixid.Caller, r keyserver.UploadRequest) (keyserver.UploadResponse, error)
	QueryKeys(ctx context.Context, c matrixid.Caller, r keyserver.QueryRequest) (keyserver.QueryResponse, error)
	ClaimKeys(ctx context.Context, c matrixid.Caller, r keyserver.ClaimRequest) (keyserver.ClaimResponse, error)
	UploadSigningKeys(ctx context.Context, c matrixid.Caller, r keyserver.SigningKeysUpload) error
	UploadSignatures(ctx context.Context, c matrixid.Caller, body map[string]map[string]json.RawMessage) (keyserver.SignaturesUploadResponse, error)
	// RemoteMaxWait is the longest a request waits for other servers.
	RemoteMaxWait() time.Duration
	// SetMembership records a membership for the admin API.
	SetMembership(ctx context.Context, roomID, userID, membership string) error
}
