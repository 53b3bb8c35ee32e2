package matrixid

// User-interactive auth, as the packages that ask for it and the one that
// runs it (package userapi) share it.

// AuthData is the "auth" member of a user-interactive request.
type AuthData struct {
	Type       string `json:"type"`
	Session    string `json:"session"`
	Password   string `json:"password"`
	User       string `json:"user"` // deprecated form of identifier
	Identifier *struct {
		Type string `json:"type"`
		User string `json:"user"`
	} `json:"identifier"`
}

// AuthRequest is the request a user-interactive auth session is started for,
// and the only one it may complete: a session started to delete one device
// cannot delete another.
type AuthRequest struct {
	UserID string // the caller; "" for a registration
	Method string
	Path   string // without the API version prefix, e.g. "/devices/ABC"
	// Params are the operation's parameters from the body, as a value
	// whose JSON encoding is deterministic (structs, sorted slices).
	Params any
	// AlsoFrom, if not nil, is another request whose sessions may
	// complete this one: a request that asks only whether auth is needed,
	// before the client knows its parameters.
	AlsoFrom *AuthRequest
}
