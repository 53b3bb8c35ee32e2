package httpx

import (
	"context"
	"net/http"

	"github.com/sirupsen/logrus"
)

func contextWithLogger(r *http.Request, l logrus.FieldLogger) context.Context {
	return context.WithValue(r.Context(), loggerKey{}, l)
}
