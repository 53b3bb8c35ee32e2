package keyserver

import (
	"encoding/base64"
	"errors"

	"github.com/keyserver/keyserver/internal/mxerr"
)

func encodeB64(b []byte) string { return base64.RawStdEncoding.EncodeToString(b) }

// errcodeOf is "" for nil, the errcode of a Matrix error, or "not a Matrix
// error".
func errcodeOf(err error) string {
	if err == nil {
		return ""
	}
	var me *mxerr.Error
	if errors.As(err, &me) {
		return me.Code
	}
	return "not a Matrix error: " + err.Error()
}
