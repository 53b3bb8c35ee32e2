package userapi

import (
	"context"
	"runtime"

	"golang.org/x/crypto/bcrypt"

	"github.com/keyserver/keyserver/internal/slots"
)

// bcrypt's functions, replaced by tests that watch how many run at once.
var (
	bcryptGenerate = bcrypt.GenerateFromPassword
	bcryptCompare  = bcrypt.CompareHashAndPassword
)

// passwordPool bounds the password hashes computed at once. One takes a
// CPU for tens of milliseconds at the default cost: a flood of logins
// would otherwise take every CPU from the other requests, where now it
// only makes the logins wait their turn.
type passwordPool struct{ *slots.Slots }

// defaultBcryptConcurrency leaves half of the CPUs to everything else.
func defaultBcryptConcurrency() int { return max(1, runtime.GOMAXPROCS(0)/2) }

func newPasswordPool(n int) *passwordPool {
	if n <= 0 {
		n = defaultBcryptConcurrency()
	}
	return &passwordPool{slots.New(n)}
}

// do runs f once a slot is free, or gives up when ctx ends.
func (p *passwordPool) do(ctx context.Context, f func()) error {
	return p.Do(ctx, func() error { f(); return nil })
}

// hashPassword hashes a password in the pool.
func (s *Service) hashPassword(ctx context.Context, password string) ([]byte, error) {
	var hash []byte
	var err error
	if perr := s.passwords.do(ctx, func() { hash, err = hashPassword(password, s.opts.BcryptCost) }); perr != nil {
		return nil, perr
	}
	return hash, err
}

// comparePassword checks a password against a hash in the pool.
func (s *Service) comparePassword(ctx context.Context, hash []byte, password string) (bool, error) {
	var err error
	if perr := s.passwords.do(ctx, func() { err = comparePassword(hash, password) }); perr != nil {
		return false, perr
	}
	return err == nil, nil
}
