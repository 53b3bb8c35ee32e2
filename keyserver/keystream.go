package keyserver

import (
	"context"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// DeviceListChanges returns whose device lists changed in (from, to],
// among the users userID shares a room with: /keys/changes and the
// device_lists of /sync (package syncapi). to may lie beyond what has
// happened yet; it is only a bound.
func (s *Service) DeviceListChanges(ctx context.Context, userID string, from, to storage.StreamPos) (storage.DeviceListChanges, error) {
	cur, err := s.db.CurrentPos(ctx)
	if err != nil {
		return storage.DeviceListChanges{}, err
	}
	return s.db.DeviceListChanges(ctx, userID, from, min(to, cur))
}

// SyncKeys returns the keys part of a /sync answer from what the stream
// read d holds: the device-list changes, the device's one-time key counts
// (signed_curve25519 always present) and its unused fallback key types.
func (s *Service) SyncKeys(d *storage.SyncData) (lists storage.DeviceListChanges, oneTimeKeyCounts map[string]int, unusedFallbackKeyTypes []string) {
	return d.DeviceLists, withSignedCurve(d.OneTimeKeyCounts), d.UnusedFallbackKeyTypes
}

// SetMembership records that a user (local or remote) joined or left a
// room. Membership is fed by an administrator or a homeserver until rooms
// are ours; the device-list logic only reads it.
func (s *Service) SetMembership(ctx context.Context, roomID, userID, membership string) error {
	// One rule for room IDs everywhere: room version 12's have no
	// ":server" part.
	if !matrixid.ValidRoomID(roomID) {
		return mxerr.InvalidParam("%q is not a valid room ID", roomID)
	}
	if _, ok := matrixid.ParseUserID(userID); !ok {
		return mxerr.InvalidParam("%q is not a valid user ID", userID)
	}
	if membership != storage.MembershipJoin && membership != storage.MembershipLeave {
		return mxerr.InvalidParam("membership must be %q or %q", storage.MembershipJoin, storage.MembershipLeave)
	}
	res, err := s.db.SetMembership(ctx, roomID, userID, membership, s.nowMS())
	if err != nil {
		return err
	}
	s.membershipChanged(res.Change, res.NewlyStale)
	if res.DeviceUpdatesQueued && s.sender != nil {
		s.sender.Poke()
	}
	return nil
}

func (s *Service) membershipChanged(ch storage.Change, newlyStale []storage.StaleUser) {
	s.streamAdvanced(ch)
	if len(newlyStale) > 0 && s.updater != nil {
		s.updater.Wake()
	}
}
