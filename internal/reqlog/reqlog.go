// Package reqlog carries a request's logger (with its request ID) in its
// context, so that every line logged while serving the request, in any
// layer, names the request.
package reqlog

import (
	"context"

	"github.com/sirupsen/logrus"
)

type key struct{}

// With returns ctx carrying l.
func With(ctx context.Context, l logrus.FieldLogger) context.Context {
	return context.WithValue(ctx, key{}, l)
}

// From returns the request's logger, or fallback outside a request.
func From(ctx context.Context, fallback logrus.FieldLogger) logrus.FieldLogger {
	if l, ok := ctx.Value(key{}).(logrus.FieldLogger); ok {
		return l
	}
	return fallback
}
