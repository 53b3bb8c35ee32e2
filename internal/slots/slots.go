// Package slots bounds how many callers do something at once: the others
// wait their turn, or give up when their context ends.
package slots

import (
	"context"
	"sync/atomic"
)

// Slots is a counting semaphore that knows how many wait.
type Slots struct {
	ch      chan struct{}
	waiting atomic.Int32
}

// New makes n slots.
func New(n int) *Slots { return &Slots{ch: make(chan struct{}, n)} }

// Do runs f once a slot is free, or returns ctx's error when ctx ends
// first; otherwise it returns what f returns.
func (s *Slots) Do(ctx context.Context, f func() error) error {
	select {
	case s.ch <- struct{}{}:
	default:
		s.waiting.Add(1)
		select {
		case s.ch <- struct{}{}:
			s.waiting.Add(-1)
		case <-ctx.Done():
			s.waiting.Add(-1)
			return ctx.Err()
		}
	}
	defer func() { <-s.ch }()
	return f()
}

// Waiting is how many callers wait for a slot now.
func (s *Slots) Waiting() int { return int(s.waiting.Load()) }
