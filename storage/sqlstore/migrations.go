package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/postgres"
)

// migration is one numbered step of the schema. Its SQL is shared by both
// databases; {{...}} placeholders are replaced by the dialect's types and
// statements.
// Steps are never edited once released: a change is a new step.
type migration struct {
	version int
	name    string
	sql     string
}

// postgresSteps are the parts of migrations that PostgreSQL alone runs,
// after the step's shared SQL, each as one statement (it may hold
// semicolons: a function's body).
//
// A released step never changes (frozen_test.go holds the digest of each):
// a database that ran it must end where a fresh one does, so a change is a
// new step, with SQL of its own.
var postgresSteps = map[int][]string{
	20: {writeRoomMessagesV20},
	22: {`DROP FUNCTION IF EXISTS write_room_messages(TEXT[], BIGINT[], BIGINT[], BIGINT[], BIGINT[], TEXT[], TEXT[], TEXT[],
		TEXT[], TEXT[], BIGINT[], TEXT[], TEXT[], TEXT[], TEXT[], BIGINT, INT[], TEXT[], TEXT, TEXT)`, writeRoomMessagesV22},
}

var migrations = []migration{
	{1, "accounts, devices, keys, device-list stream, memberships", `
CREATE TABLE accounts (
	user_id       TEXT PRIMARY KEY,
	password_hash TEXT NOT NULL,
	created_ts    {{BIGINT}} NOT NULL
);

CREATE TABLE devices (
	user_id      TEXT NOT NULL,
	device_id    TEXT NOT NULL,
	display_name TEXT,
	-- identity keys as canonical JSON; NULL until the device uploads them
	key_json     TEXT,
	created_ts   {{BIGINT}} NOT NULL,
	last_seen_ts {{BIGINT}} NOT NULL,
	last_seen_ip TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (user_id, device_id)
);

-- only a hash of each token is kept, so a copy of the database cannot be
-- used to act as a user
CREATE TABLE access_tokens (
	token_hash TEXT PRIMARY KEY,
	user_id    TEXT NOT NULL,
	device_id  TEXT NOT NULL,
	created_ts {{BIGINT}} NOT NULL
);
CREATE INDEX access_tokens_device ON access_tokens (user_id, device_id);

-- id orders keys by upload, so claims hand out the oldest first
CREATE TABLE one_time_keys (
	id        {{ID}},
	user_id   TEXT NOT NULL,
	device_id TEXT NOT NULL,
	algorithm TEXT NOT NULL,
	key_id    TEXT NOT NULL,
	key_json  TEXT NOT NULL,
	UNIQUE (user_id, device_id, algorithm, key_id)
);
CREATE INDEX one_time_keys_claim ON one_time_keys (user_id, device_id, algorithm, id);

CREATE TABLE fallback_keys (
	user_id   TEXT NOT NULL,
	device_id TEXT NOT NULL,
	algorithm TEXT NOT NULL,
	key_id    TEXT NOT NULL,
	key_json  TEXT NOT NULL,
	used      BOOLEAN NOT NULL DEFAULT FALSE,
	PRIMARY KEY (user_id, device_id, algorithm)
);

-- the one counter all stream positions come from (see nextPos)
CREATE TABLE stream_position (
	id  INTEGER PRIMARY KEY,
	pos {{BIGINT}} NOT NULL
);
INSERT INTO stream_position (id, pos) VALUES (1, 0);

CREATE TABLE device_list_changes (
	pos       {{BIGINT}} PRIMARY KEY,
	user_id   TEXT NOT NULL,
	device_id TEXT NOT NULL,
	deleted   BOOLEAN NOT NULL
);
CREATE INDEX device_list_changes_user ON device_list_changes (user_id, pos);

CREATE TABLE memberships (
	room_id    TEXT NOT NULL,
	user_id    TEXT NOT NULL,
	membership TEXT NOT NULL,
	pos        {{BIGINT}} NOT NULL,
	PRIMARY KEY (room_id, user_id)
);
CREATE INDEX memberships_user ON memberships (user_id, membership);
`},
	{2, "server keys, cached remote device lists, stale marks", `
-- other servers' signing keys, as fetched from them
CREATE TABLE server_keys (
	server_name    TEXT NOT NULL,
	key_id         TEXT NOT NULL,
	public_key     TEXT NOT NULL,
	valid_until_ts {{BIGINT}} NOT NULL,
	-- 0 while the key is current; when it was retired otherwise
	expired_ts     {{BIGINT}} NOT NULL,
	PRIMARY KEY (server_name, key_id)
);

-- remote users whose device list is cached, with the stream_id it is at
CREATE TABLE remote_device_lists (
	user_id     TEXT PRIMARY KEY,
	server_name TEXT NOT NULL,
	stream_id   {{BIGINT}} NOT NULL,
	fetched_ts  {{BIGINT}} NOT NULL
);

CREATE TABLE remote_devices (
	user_id      TEXT NOT NULL,
	device_id    TEXT NOT NULL,
	display_name TEXT,
	key_json     TEXT NOT NULL,
	PRIMARY KEY (user_id, device_id)
);

-- remote users whose cached list may be out of date and must be fetched
-- again before it is trusted; written before any fetch, so a crash cannot
-- lose the need
CREATE TABLE stale_device_lists (
	user_id     TEXT PRIMARY KEY,
	server_name TEXT NOT NULL,
	since_ts    {{BIGINT}} NOT NULL
);
CREATE INDEX stale_device_lists_server ON stale_device_lists (server_name);
`},
	{3, "outbound device-list updates, seen remote stream IDs, inbound transactions, resync retries", `
-- the newest pending update of each (user, device) for each destination:
-- a newer change replaces an unsent older one, so duplicates never go out
CREATE TABLE outbound_device_updates (
	destination TEXT NOT NULL,
	user_id     TEXT NOT NULL,
	device_id   TEXT NOT NULL,
	stream_id   {{BIGINT}} NOT NULL,
	PRIMARY KEY (destination, user_id, device_id)
);

-- the last stream_id of each user delivered to each destination: the
-- prev_id of the next update sent there
CREATE TABLE outbound_last_sent (
	destination TEXT NOT NULL,
	user_id     TEXT NOT NULL,
	stream_id   {{BIGINT}} NOT NULL,
	PRIMARY KEY (destination, user_id)
);

-- which daemon sends to a destination, when several share the database
CREATE TABLE outbound_leases (
	destination TEXT PRIMARY KEY,
	owner       TEXT NOT NULL,
	expires_ts  {{BIGINT}} NOT NULL
);

-- recent stream_ids seen for each remote user (the newest few are kept),
-- against which an update's prev_id is checked
CREATE TABLE remote_stream_ids (
	user_id   TEXT NOT NULL,
	stream_id {{BIGINT}} NOT NULL,
	PRIMARY KEY (user_id, stream_id)
);

-- answers to /send transactions already processed, so a retry gets the same
-- answer and is not processed again; pruned after a day
CREATE TABLE inbound_transactions (
	origin      TEXT NOT NULL,
	txn_id      TEXT NOT NULL,
	response    TEXT NOT NULL,
	received_ts {{BIGINT}} NOT NULL,
	PRIMARY KEY (origin, txn_id)
);
CREATE INDEX inbound_transactions_received ON inbound_transactions (received_ts);

ALTER TABLE stale_device_lists ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE stale_device_lists ADD COLUMN retry_at_ts {{BIGINT}} NOT NULL DEFAULT 0;
CREATE INDEX stale_device_lists_due ON stale_device_lists (retry_at_ts);
`},
	{4, "one-time key counts", `
-- unclaimed one-time keys of each device and algorithm, kept by the
-- statements that store, claim and delete them: an upload and every /sync
-- read the count instead of counting the keys (and their dead versions)
CREATE TABLE one_time_key_counts (
	user_id   TEXT NOT NULL,
	device_id TEXT NOT NULL,
	algorithm TEXT NOT NULL,
	unclaimed {{BIGINT}} NOT NULL,
	PRIMARY KEY (user_id, device_id, algorithm)
);
INSERT INTO one_time_key_counts (user_id, device_id, algorithm, unclaimed)
SELECT user_id, device_id, algorithm, COUNT(*) FROM one_time_keys GROUP BY user_id, device_id, algorithm;
{{COUNT_CLAIMS}}
`},
	{5, "claims without an index ordered by id, on SQLite", `
-- On SQLite a claim finds a device's oldest key with MIN(id) over the
-- unique index, whose entries end with the id; the index by id cost every
-- upload as many pages again. PostgreSQL claims through it with
-- FOR UPDATE SKIP LOCKED, which MIN cannot take, and keeps it.
{{DROP_CLAIM_INDEX}}
`},
	{6, "text compares as bytes on PostgreSQL", `
-- Every text column here holds identifiers, keys or JSON, which are
-- compared for equality and ordered only to be found in an index: byte
-- order does that, where the database's default collation (en_US.UTF-8,
-- C.UTF-8) calls strcoll for every comparison while walking an index.
-- Uploads were about 5-10 % slower for it. A text column added later
-- needs the same, through the dialect's schema: PostgreSQL refuses to
-- compare two columns of different collations.
{{TEXT_AS_BYTES}}
`},
	{7, "user-interactive auth sessions, deactivated accounts", `
-- user-interactive auth sessions, kept in the database so that a session
-- started on one daemon completes on another sharing it. A session is
-- bound to the request it was started for by request_hash, a SHA-256 over
-- the session ID and that request's user, method, path and parameters: the
-- parameters themselves (a new password) are never stored. A completed
-- session is deleted; expired ones are deleted when new sessions start.
CREATE TABLE uia_sessions (
	session_id   {{TEXT}} PRIMARY KEY,
	user_id      {{TEXT}} NOT NULL,
	request_hash {{TEXT}} NOT NULL,
	expires_ts   {{BIGINT}} NOT NULL
);
CREATE INDEX uia_sessions_expires ON uia_sessions (expires_ts);

-- a deactivated account keeps its row, with an empty password hash, so its
-- user ID is never registered again; 0 while the account is active
ALTER TABLE accounts ADD COLUMN deactivated_ts {{BIGINT}} NOT NULL DEFAULT 0;
`},
	{8, "server-side key backups", `
-- the last backup version number given to each user: versions count up
-- from 1 and are never given twice, deleted ones included. Every change
-- of a user's backups locks this row first, so they happen one at a time.
CREATE TABLE backup_users (
	user_id      {{TEXT}} PRIMARY KEY,
	last_version {{BIGINT}} NOT NULL
);

-- the versions not deleted; the highest is the current one. etag is
-- bumped by every change of the version's keys, key_count is their number.
CREATE TABLE backup_versions (
	user_id   {{TEXT}} NOT NULL,
	version   {{BIGINT}} NOT NULL,
	algorithm {{TEXT}} NOT NULL,
	auth_data {{TEXT}} NOT NULL,
	etag      {{BIGINT}} NOT NULL,
	key_count {{BIGINT}} NOT NULL,
	PRIMARY KEY (user_id, version)
);

-- session_data is the client's JSON object, opaque to the server
CREATE TABLE backup_keys (
	user_id             {{TEXT}} NOT NULL,
	version             {{BIGINT}} NOT NULL,
	room_id             {{TEXT}} NOT NULL,
	session_id          {{TEXT}} NOT NULL,
	first_message_index {{BIGINT}} NOT NULL,
	forwarded_count     {{BIGINT}} NOT NULL,
	is_verified         BOOLEAN NOT NULL,
	session_data        {{TEXT}} NOT NULL,
	PRIMARY KEY (user_id, version, room_id, session_id)
);
`},
	{9, "account data", `
-- the newest content of each account data type of a user, global (room_id
-- empty) or per room; pos is the stream position of its last change, from
-- the same counter as device-list changes, so that /sync tokens cover it
CREATE TABLE account_data (
	user_id   {{TEXT}} NOT NULL,
	room_id   {{TEXT}} NOT NULL,
	data_type {{TEXT}} NOT NULL,
	content   {{TEXT}} NOT NULL,
	pos       {{BIGINT}} NOT NULL,
	PRIMARY KEY (user_id, room_id, data_type)
);
CREATE INDEX account_data_changes ON account_data (user_id, pos);
`},
	{10, "cross-signing keys, signatures and their changes", `
-- local users' cross-signing keys, one per usage (master, self_signing,
-- user_signing), as canonical JSON with the signatures they came with
CREATE TABLE cross_signing_keys (
	user_id  {{TEXT}} NOT NULL,
	usage    {{TEXT}} NOT NULL,
	key_json {{TEXT}} NOT NULL,
	PRIMARY KEY (user_id, usage)
);

-- signatures uploaded apart from what they sign: on a local user's device
-- (target_key_id is the device ID) or master key (its public key), by the
-- signer's device or cross-signing key. Signatures by a replaced key stay,
-- as Synapse keeps them; clients check them against the current keys.
CREATE TABLE cross_signing_signatures (
	target_user_id {{TEXT}} NOT NULL,
	target_key_id  {{TEXT}} NOT NULL,
	signer_user_id {{TEXT}} NOT NULL,
	signer_key_id  {{TEXT}} NOT NULL,
	signature      {{TEXT}} NOT NULL,
	PRIMARY KEY (target_user_id, target_key_id, signer_user_id, signer_key_id)
);

-- changes of cross-signing keys, in the device-list stream: everyone
-- sharing a room with the user is told, or with owner_only the user alone
-- (user-signing keys and what they sign). Kept apart from
-- device_list_changes, whose positions are the stream_ids other servers
-- follow device by device.
CREATE TABLE cross_signing_changes (
	pos        {{BIGINT}} PRIMARY KEY,
	user_id    {{TEXT}} NOT NULL,
	owner_only BOOLEAN NOT NULL
);
CREATE INDEX cross_signing_changes_user ON cross_signing_changes (user_id, pos);

-- remote users' master and self-signing keys, cached with their device
-- list (from /user/devices and m.signing_key_update) and dropped with it
CREATE TABLE remote_cross_signing_keys (
	user_id  {{TEXT}} NOT NULL,
	usage    {{TEXT}} NOT NULL,
	key_json {{TEXT}} NOT NULL,
	PRIMARY KEY (user_id, usage)
);
`},
	{11, "outbound cross-signing key updates", `
-- local users whose master or self-signing key changed, for each server
-- sharing a room with them that has not been sent the change: one row per
-- user and destination, a newer change replacing an unsent older one (the
-- keys sent are those current when sending). Kept apart from
-- outbound_device_updates: these are not in the device-list chain.
CREATE TABLE outbound_signing_key_updates (
	destination {{TEXT}} NOT NULL,
	user_id     {{TEXT}} NOT NULL,
	stream_id   {{BIGINT}} NOT NULL,
	PRIMARY KEY (destination, user_id)
);
`},
	{12, "to-device messages", `
-- the to-device messages waiting for a local device, in the order of pos:
-- a position of the stream counter, taken by the transaction that stored
-- the message (one message per device and position), so that a /sync
-- token can say up to where a device has received its messages
CREATE TABLE to_device_inbox (
	user_id    {{TEXT}} NOT NULL,
	device_id  {{TEXT}} NOT NULL,
	pos        {{BIGINT}} NOT NULL,
	sender     {{TEXT}} NOT NULL,
	event_type {{TEXT}} NOT NULL,
	content    {{TEXT}} NOT NULL,
	PRIMARY KEY (user_id, device_id, pos)
);

-- the sends already stored, so that a retry stores nothing twice: a local
-- device's transaction IDs (origin is the user ID, device_id its device)
-- and the message_ids of other servers (origin is the server name,
-- device_id empty). Kept a day, as inbound_transactions.
CREATE TABLE to_device_sends (
	origin      {{TEXT}} NOT NULL,
	device_id   {{TEXT}} NOT NULL,
	txn_id      {{TEXT}} NOT NULL,
	received_ts {{BIGINT}} NOT NULL,
	PRIMARY KEY (origin, device_id, txn_id)
);
CREATE INDEX to_device_sends_received ON to_device_sends (received_ts);

-- m.direct_to_device EDUs waiting to be sent to other servers, oldest
-- first; the device-list sender delivers them with its own updates
CREATE TABLE outbound_to_device (
	id          {{ID}},
	destination {{TEXT}} NOT NULL,
	content     {{TEXT}} NOT NULL
);
CREATE INDEX outbound_to_device_destination ON outbound_to_device (destination, id);
`},
	{13, "dehydrated devices", `
-- each user's dehydrated device (MSC3814), at most one: a device of the
-- devices table without access tokens, and the client's opaque
-- device_data (a JSON object) to rehydrate it with
CREATE TABLE dehydrated_devices (
	user_id     {{TEXT}} PRIMARY KEY,
	device_id   {{TEXT}} NOT NULL,
	device_data {{TEXT}} NOT NULL
);
`},
	{14, "rooms: events with their room version, state snapshots, current state, aliases, transaction IDs", `
-- a room this server takes part in. room_version decides the format of its
-- events and its auth rules; state_snapshot is the room's current state
-- (the state after its forward extremities); depth the greatest depth of
-- its events
CREATE TABLE rooms (
	room_id        {{TEXT}} PRIMARY KEY,
	room_version   {{TEXT}} NOT NULL,
	creator        {{TEXT}} NOT NULL,
	published      INTEGER NOT NULL DEFAULT 0,
	depth          {{BIGINT}} NOT NULL,
	state_snapshot {{BIGINT}} NOT NULL,
	created_ts     {{BIGINT}} NOT NULL
);

-- every event stored, as the PDU (federation format) it is, with its room
-- version beside it. state_before is the snapshot of the room's state
-- before the event, pos its place in the /sync stream; both are NULL for
-- an outlier (an event stored without knowing the state before it: auth
-- chains and state from other servers, invites to rooms we are not in).
-- A rejected event is kept so it is not fetched again, never served to
-- clients, never a prev event and never state.
CREATE TABLE room_events (
	event_nid    {{ID}},
	event_id     {{TEXT}} NOT NULL UNIQUE,
	room_id      {{TEXT}} NOT NULL,
	event_type   {{TEXT}} NOT NULL,
	state_key    {{TEXT}},
	sender       {{TEXT}} NOT NULL,
	depth        {{BIGINT}} NOT NULL,
	room_version {{TEXT}} NOT NULL,
	event_json   {{TEXT}} NOT NULL,
	outlier      INTEGER NOT NULL DEFAULT 0,
	rejected     INTEGER NOT NULL DEFAULT 0,
	soft_failed  INTEGER NOT NULL DEFAULT 0,
	state_before {{BIGINT}},
	pos          {{BIGINT}}
);
CREATE INDEX room_events_timeline ON room_events (room_id, pos);
CREATE INDEX room_events_pos ON room_events (pos);

-- the events no other event of the room points at yet: the prev_events of
-- the room's next event
CREATE TABLE room_extremities (
	room_id  {{TEXT}} NOT NULL,
	event_id {{TEXT}} NOT NULL,
	PRIMARY KEY (room_id, event_id)
);

-- a state snapshot is a full map (type, state_key) -> event; snapshots are
-- shared by every event with the same state before it (a message does not
-- make a new one)
CREATE TABLE room_state_snapshots (
	snapshot_nid {{ID}},
	room_id      {{TEXT}} NOT NULL
);
CREATE TABLE room_state_entries (
	snapshot_nid {{BIGINT}} NOT NULL,
	event_type   {{TEXT}} NOT NULL,
	state_key    {{TEXT}} NOT NULL,
	event_nid    {{BIGINT}} NOT NULL,
	PRIMARY KEY (snapshot_nid, event_type, state_key)
);

-- the room's current state again, by key, for the queries of members and
-- of a user's rooms; membership is the content's for m.room.member
CREATE TABLE room_current_state (
	room_id    {{TEXT}} NOT NULL,
	event_type {{TEXT}} NOT NULL,
	state_key  {{TEXT}} NOT NULL,
	event_nid  {{BIGINT}} NOT NULL,
	membership {{TEXT}},
	pos        {{BIGINT}} NOT NULL,
	PRIMARY KEY (room_id, event_type, state_key)
);
CREATE INDEX room_current_state_member ON room_current_state (state_key, membership);

CREATE TABLE room_aliases (
	alias   {{TEXT}} PRIMARY KEY,
	room_id {{TEXT}} NOT NULL,
	creator {{TEXT}} NOT NULL
);

-- client transaction IDs: the event a device's request on a path made
CREATE TABLE room_txns (
	user_id    {{TEXT}} NOT NULL,
	device_id  {{TEXT}} NOT NULL,
	txn_path   {{TEXT}} NOT NULL,
	event_id   {{TEXT}} NOT NULL,
	created_ts {{BIGINT}} NOT NULL,
	PRIMARY KEY (user_id, device_id, txn_path)
);

CREATE TABLE room_forgotten (
	user_id {{TEXT}} NOT NULL,
	room_id {{TEXT}} NOT NULL,
	PRIMARY KEY (user_id, room_id)
);

-- /sync filters, numbered per user
CREATE TABLE sync_filters (
	user_id     {{TEXT}} NOT NULL,
	filter_id   {{BIGINT}} NOT NULL,
	filter_json {{TEXT}} NOT NULL,
	PRIMARY KEY (user_id, filter_id)
);
`},
	{15, "rooms: the state after each event, for events that build on events other than the newest", `
-- state_after is the snapshot of the room's state after the event: its
-- state_before for a message, a new snapshot for a state event. An event
-- from another server is placed after the state after its prev_events.
ALTER TABLE room_events ADD COLUMN state_after {{BIGINT}};
-- Until now every room was one chain: the state after an event is the
-- state before the next one, or the room's current state after the last.
UPDATE room_events SET state_after = state_before WHERE state_key IS NULL AND state_before IS NOT NULL;
UPDATE room_events SET state_after = COALESCE(
	(SELECT e2.state_before FROM room_events e2 WHERE e2.room_id = room_events.room_id
		AND e2.event_nid > room_events.event_nid AND e2.state_before IS NOT NULL ORDER BY e2.event_nid LIMIT 1),
	(SELECT r.state_snapshot FROM rooms r WHERE r.room_id = room_events.room_id))
WHERE state_key IS NOT NULL AND state_before IS NOT NULL;
`},
	{16, "outbound PDUs", `
-- our room events waiting to be sent to other servers, per destination in
-- the order queued (id); the device-list sender delivers them with its
-- EDUs. A row names the event by its nid in room_events rather than
-- holding a copy of the PDU: one event usually goes to several servers,
-- so its JSON is kept once, and read when its transaction is built (an
-- event redacted meanwhile goes out redacted). A row goes when its
-- transaction is delivered; an event is queued once per destination.
CREATE TABLE outbound_pdus (
	id          {{ID}},
	destination {{TEXT}} NOT NULL,
	event_nid   {{BIGINT}} NOT NULL,
	UNIQUE (destination, event_nid)
);
CREATE INDEX outbound_pdus_destination ON outbound_pdus (destination, id);
`},
	{17, "stale device lists: a resync in progress holds its user", `
-- until when a daemon fetching the user's list holds it (milliseconds; 0:
-- nobody): the others wait for that fetch instead of sending their own,
-- and the updater leaves the user alone meanwhile
ALTER TABLE stale_device_lists ADD COLUMN resync_until {{BIGINT}} NOT NULL DEFAULT 0;
`},
	{18, "rooms: a head that changes with every write", `
-- a number every write of the room replaces by a new one (random): a write
-- built on what was read of the room names the head it read, and is made
-- only if the room still has it. One compare on the row the write locks
-- anyway, instead of reading the extremities back; and a write built on
-- another not yet committed names that one's new head, so it fails if
-- that one does.
ALTER TABLE rooms ADD COLUMN head {{BIGINT}} NOT NULL DEFAULT 0;
`},
	{19, "room events: no index on the stream position alone", `
-- every read of events by position names their room (room_events_timeline);
-- the index on the position alone only cost every event's write a page
DROP INDEX room_events_pos;
`},
	{20, "PostgreSQL: room messages written by a function (postgresSteps)", ``},
	{21, "profiles", `
-- a local user's public profile; a user without a row has the default
-- profile (their localpart as display name, no avatar), and NULL is a
-- field the user removed
CREATE TABLE profiles (
	user_id     {{TEXT}} PRIMARY KEY,
	displayname {{TEXT}},
	avatar_url  {{TEXT}}
);
`},
	{22, "PostgreSQL: room messages claim their transaction first (postgresSteps)", ``},
	{23, "outbound destinations' retry state", `
-- the destinations whose deliveries fail, shared by the daemons of the
-- database: the attempts since one last got through or the destination was
-- last heard from, the first of them, and when the next is due
CREATE TABLE outbound_destinations (
	destination      {{TEXT}} PRIMARY KEY,
	attempts         INTEGER NOT NULL,
	failing_since_ts {{BIGINT}} NOT NULL,
	retry_at_ts      {{BIGINT}} NOT NULL
);
`},
	{24, "outbound destinations: when the last failure was stored", `
-- a sign of life forgets only the failures stored before it; 0 for those
-- stored before this column was
ALTER TABLE outbound_destinations ADD COLUMN recorded_ts {{BIGINT}} NOT NULL DEFAULT 0;
`},
	{25, "media repository", `
-- a piece of media: a local upload (origin is this server) or a remote
-- file cached here. Its bytes are a file named by sha256 under the media
-- directory; sha256 is '' while an ID reserved for an asynchronous upload
-- waits for content, until expires_ts (0 once filled). user_id is the
-- local uploader ('' for remote media). authenticated media is served by
-- the authenticated download endpoints only.
CREATE TABLE media (
	origin        {{TEXT}} NOT NULL,
	media_id      {{TEXT}} NOT NULL,
	user_id       {{TEXT}} NOT NULL,
	content_type  {{TEXT}} NOT NULL,
	upload_name   {{TEXT}} NOT NULL,
	sha256        {{TEXT}} NOT NULL,
	size          {{BIGINT}} NOT NULL,
	created_ts    {{BIGINT}} NOT NULL,
	expires_ts    {{BIGINT}} NOT NULL,
	authenticated INTEGER NOT NULL,
	PRIMARY KEY (origin, media_id)
);
CREATE INDEX media_reserved ON media (user_id, sha256);

-- the thumbnails made of a piece of media, one per size and method, their
-- bytes named by sha256 like the media's
CREATE TABLE media_thumbnails (
	origin       {{TEXT}} NOT NULL,
	media_id     {{TEXT}} NOT NULL,
	width        INTEGER NOT NULL,
	height       INTEGER NOT NULL,
	method       {{TEXT}} NOT NULL,
	content_type {{TEXT}} NOT NULL,
	sha256       {{TEXT}} NOT NULL,
	size         {{BIGINT}} NOT NULL,
	PRIMARY KEY (origin, media_id, width, height, method)
);
`},
	{26, "pushers, notifications and unread counts", `
-- a device's registration for push notifications; it lives while its
-- device (user_id, device_id) has an access token
CREATE TABLE pushers (
	user_id             {{TEXT}} NOT NULL,
	device_id           {{TEXT}} NOT NULL,
	app_id              {{TEXT}} NOT NULL,
	pushkey             {{TEXT}} NOT NULL,
	kind                {{TEXT}} NOT NULL,
	app_display_name    {{TEXT}} NOT NULL,
	device_display_name {{TEXT}} NOT NULL,
	profile_tag         {{TEXT}} NOT NULL,
	lang                {{TEXT}} NOT NULL,
	data                {{TEXT}} NOT NULL,
	pushkey_ts          {{BIGINT}} NOT NULL,
	PRIMARY KEY (user_id, app_id, pushkey)
);
CREATE INDEX pushers_key ON pushers (app_id, pushkey);

-- the events that notified a user (their push rules said notify), for
-- the unread counts; those at or before the user's read position in the
-- room go
CREATE TABLE push_notifications (
	user_id   {{TEXT}} NOT NULL,
	room_id   {{TEXT}} NOT NULL,
	event_id  {{TEXT}} NOT NULL,
	pos       {{BIGINT}} NOT NULL,
	highlight INTEGER NOT NULL,
	ts        {{BIGINT}} NOT NULL,
	PRIMARY KEY (user_id, event_id)
);
CREATE INDEX push_notifications_room ON push_notifications (user_id, room_id, pos);

-- where a user has read a room up to (their own latest event in it)
CREATE TABLE push_read (
	user_id {{TEXT}} NOT NULL,
	room_id {{TEXT}} NOT NULL,
	pos     {{BIGINT}} NOT NULL,
	PRIMARY KEY (user_id, room_id)
);

-- the stream position up to which room events have been evaluated for
-- notifications; it starts at the stream's current position, so history
-- from before this step notifies nobody
CREATE TABLE push_cursor (
	id  INTEGER PRIMARY KEY,
	pos {{BIGINT}} NOT NULL
);
INSERT INTO push_cursor (id, pos) SELECT 1, pos FROM stream_position WHERE id = 1;
`},
	{27, "receipts and typing", `
-- each user's latest receipt in a room per type and thread (thread_id ''
-- for an unthreaded one), at the stream position it was stored at;
-- event_pos is the event's position (0 while the event is not known)
CREATE TABLE receipts (
	room_id      {{TEXT}} NOT NULL,
	receipt_type {{TEXT}} NOT NULL,
	user_id      {{TEXT}} NOT NULL,
	thread_id    {{TEXT}} NOT NULL,
	event_id     {{TEXT}} NOT NULL,
	event_pos    {{BIGINT}} NOT NULL,
	ts           {{BIGINT}} NOT NULL,
	pos          {{BIGINT}} NOT NULL,
	PRIMARY KEY (room_id, receipt_type, user_id, thread_id)
);
CREATE INDEX receipts_pos ON receipts (pos);

-- who is typing in which room, until when (ms), and when its m.typing EDU
-- was last queued for the room's other servers (0: never, another
-- server's user); typing_rooms holds the stream position of each room's
-- last change of who is typing
CREATE TABLE typing (
	room_id    {{TEXT}} NOT NULL,
	user_id    {{TEXT}} NOT NULL,
	expires_ts {{BIGINT}} NOT NULL,
	sent_ts    {{BIGINT}} NOT NULL,
	PRIMARY KEY (room_id, user_id)
);
CREATE INDEX typing_expires ON typing (expires_ts);
CREATE TABLE typing_rooms (
	room_id {{TEXT}} PRIMARY KEY,
	pos     {{BIGINT}} NOT NULL
);
CREATE INDEX typing_rooms_pos ON typing_rooms (pos);

-- the queue of to-device EDUs carries the other EDUs of rooms too
-- (m.typing, m.receipt), each with its type
ALTER TABLE outbound_to_device ADD COLUMN edu_type {{TEXT}} NOT NULL DEFAULT 'm.direct_to_device';
`},
	{28, "presence", `
-- each user's presence, local or remote; pos is the stream position of
-- the last change clients were told of, times are Unix ms (0: never)
CREATE TABLE presence (
	user_id                   {{TEXT}} PRIMARY KEY,
	state                     {{TEXT}} NOT NULL,
	status_msg                {{TEXT}},
	last_active_ts            {{BIGINT}} NOT NULL,
	last_user_sync_ts         {{BIGINT}} NOT NULL,
	last_federation_update_ts {{BIGINT}} NOT NULL,
	currently_active          BOOLEAN NOT NULL,
	pos                       {{BIGINT}} NOT NULL
);
CREATE INDEX presence_pos ON presence (pos);

-- the joins of one write, found by its position (presence is sent to the
-- servers that newly share a room)
CREATE INDEX memberships_pos ON memberships (pos);

-- the local users' presence waiting to be sent to other servers: one
-- entry of an m.presence push list per destination and user
CREATE TABLE outbound_presence (
	id          {{ID}},
	destination {{TEXT}} NOT NULL,
	user_id     {{TEXT}} NOT NULL,
	content     {{TEXT}} NOT NULL
);
CREATE UNIQUE INDEX outbound_presence_user ON outbound_presence (destination, user_id);
CREATE INDEX outbound_presence_destination ON outbound_presence (destination, id);
`},
	{29, "relations between events", `
-- an event's relation to another of its room (content m.relates_to with
-- rel_type and event_id): written with the event, deleted when it is
-- redacted. Events stored before this step have none.
CREATE TABLE event_relations (
	event_id  {{TEXT}} PRIMARY KEY,
	room_id   {{TEXT}} NOT NULL,
	parent_id {{TEXT}} NOT NULL,
	rel_type  {{TEXT}} NOT NULL
);
CREATE INDEX event_relations_parent ON event_relations (parent_id, rel_type);
CREATE INDEX event_relations_room ON event_relations (room_id, rel_type);
`},
	{31, "full-text search of room events", `
-- the words of the room events /search finds (message bodies, room names
-- and topics), by event_nid
{{EVENT_SEARCH}}

-- the event_nid up to which room events are in the index: events are
-- indexed in the order they were stored, history included
CREATE TABLE search_position (
	id        INTEGER PRIMARY KEY,
	event_nid {{BIGINT}} NOT NULL
);
INSERT INTO search_position (id, event_nid) VALUES (1, 0);
`},
}

// SchemaVersion is the newest schema version this program knows.
func SchemaVersion() int { return migrations[len(migrations)-1].version }

// migrate applies every step the database has not seen, each in its own
// transaction, and refuses a database written by a newer version.
func (s *Store) migrate(ctx context.Context) error {
	conn, err := s.wdb.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if s.d.name == "postgres" {
		// Several daemons may share the database and start together.
		if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, postgres.MigrationLock); err != nil {
			return fmt.Errorf("lock for migrations: %w", err)
		}
		defer conn.ExecContext(context.Background(), `SELECT pg_advisory_unlock($1)`, postgres.MigrationLock) //nolint:errcheck
	}
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_ts `+s.d.schema["{{BIGINT}}"]+` NOT NULL)`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	var newest sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&newest); err != nil {
		return err
	}
	latest := SchemaVersion()
	if newest.Valid && int(newest.Int64) > latest {
		return fmt.Errorf("%w: schema version %d, this program knows up to %d", storage.ErrTooNew, newest.Int64, latest)
	}
	// Every step not applied yet is applied, also one numbered below the
	// newest applied (steps made side by side are released in any order):
	// apply skips those applied.
	for _, m := range migrations {
		if err := s.apply(ctx, conn, m); err != nil {
			return fmt.Errorf("migration %d (%s): %w", m.version, m.name, err)
		}
	}
	return nil
}

func (s *Store) apply(ctx context.Context, conn *sql.Conn, m migration) error {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	var done int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = $1`, m.version).Scan(&done); err != nil {
		return err
	}
	if done > 0 {
		return nil
	}
	ddl := m.sql
	for k, v := range s.d.schema {
		ddl = strings.ReplaceAll(ddl, k, v)
	}
	stmts := splitStatements(ddl)
	if s.d.name == "postgres" {
		stmts = append(stmts, postgresSteps[m.version]...)
	}
	for _, stmt := range stmts {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("%w in: %s", err, stmt)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_ts) VALUES ($1, $2, $3)`,
		m.version, m.name, time.Now().UnixMilli()); err != nil {
		return err
	}
	return tx.Commit()
}

// splitStatements splits a migration at semicolons that end a line; the
// schema uses no semicolons inside statements.
func splitStatements(sqlText string) []string {
	var out []string
	for _, part := range strings.Split(sqlText, ";\n") {
		var lines []string
		for _, line := range strings.Split(part, "\n") {
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "--") {
				lines = append(lines, line)
			}
		}
		if stmt := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(strings.Join(lines, "\n")), ";")); stmt != "" {
			out = append(out, stmt)
		}
	}
	return out
}

// write_room_messages writes a batch of room messages in one call, in
// order (see writeMessages): each only if its room still has the head it
// was built on (a later message of the same room names the head an
// earlier one leaves) and its client transaction has no event yet. It
// returns, for each message (msg: its index from 0), outcome 0 and its
// stream position when written, 1 when its room did not have its head
// (or is unknown), 2 when its transaction was taken. A message claims
// its transaction first (the claim is the check: no lookup before it),
// then moves its room; a message whose transaction is taken leaves the
// room as it is, so the messages built on it fail too, and one whose room
// has moved gives its claim back. The stream's counter is locked after
// the rooms and transactions, as every room write does. A room's
// extremity is replaced by its whole key (see txReplaceExtremities).
// Migration 22 replaces the function of migration 20 (writeRoomMessagesV20),
// which looked the transaction up before moving the room and claimed it
// after (taking a spare head when the claim failed). A change of the
// function is a new migration with a constant of its own.
const writeRoomMessagesV22 = `
CREATE OR REPLACE FUNCTION write_room_messages(room_ids TEXT[], heads BIGINT[], new_heads BIGINT[],
	depths BIGINT[], event_ids TEXT[], event_types TEXT[], senders TEXT[], room_versions TEXT[], event_jsons TEXT[],
	snapshots BIGINT[], prevs TEXT[], txn_users TEXT[], txn_devices TEXT[], txn_paths TEXT[], now_ms BIGINT,
	target_idx INT[], targets TEXT[], channel TEXT, payload TEXT)
RETURNS TABLE (msg INT, outcome INT, at_pos BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
	n INT := COALESCE(array_length(room_ids, 1), 0);
	moved BOOLEAN[] := array_fill(false, ARRAY[n]);
	written INT := 0;
	v_pos BIGINT;
	v_nid BIGINT;
BEGIN
	FOR k IN 1..n LOOP
		IF txn_users[k] IS NOT NULL THEN
			INSERT INTO room_txns (user_id, device_id, txn_path, event_id, created_ts)
				VALUES (txn_users[k], txn_devices[k], txn_paths[k], event_ids[k], now_ms)
				ON CONFLICT DO NOTHING;
			IF NOT FOUND THEN
				msg := k - 1; outcome := 2; at_pos := NULL;
				RETURN NEXT;
				CONTINUE;
			END IF;
		END IF;
		UPDATE rooms SET head = new_heads[k], depth = GREATEST(depth, depths[k])
			WHERE room_id = room_ids[k] AND head = heads[k];
		IF NOT FOUND THEN
			IF txn_users[k] IS NOT NULL THEN
				DELETE FROM room_txns WHERE user_id = txn_users[k] AND device_id = txn_devices[k] AND txn_path = txn_paths[k];
			END IF;
			msg := k - 1; outcome := 1; at_pos := NULL;
			RETURN NEXT;
			CONTINUE;
		END IF;
		moved[k] := true;
		written := written + 1;
	END LOOP;
	IF written = 0 THEN
		RETURN;
	END IF;
	UPDATE stream_position SET pos = pos + written WHERE id = 1 RETURNING pos - written INTO v_pos;
	FOR k IN 1..n LOOP
		CONTINUE WHEN NOT moved[k];
		v_pos := v_pos + 1;
		INSERT INTO room_events (event_id, room_id, event_type, sender, depth, room_version, event_json, state_before, state_after, pos)
			VALUES (event_ids[k], room_ids[k], event_types[k], senders[k], depths[k], room_versions[k], event_jsons[k],
				snapshots[k], snapshots[k], v_pos)
			RETURNING event_nid INTO v_nid;
		UPDATE room_extremities SET event_id = event_ids[k] WHERE room_id = room_ids[k] AND event_id = prevs[k];
		IF k - 1 = ANY (target_idx) THEN
			INSERT INTO outbound_pdus (destination, event_nid)
				SELECT d.destination, v_nid FROM unnest(target_idx, targets) AS d(i, destination) WHERE d.i = k - 1
				ORDER BY d.destination
				ON CONFLICT DO NOTHING;
		END IF;
		msg := k - 1; outcome := 0; at_pos := v_pos;
		RETURN NEXT;
	END LOOP;
	PERFORM pg_notify(channel, payload);
END
$$`

// writeRoomMessagesV20 is write_room_messages as migration 20 created it,
// kept as released: migration 22 replaces it (writeRoomMessagesV22).
const writeRoomMessagesV20 = `
CREATE FUNCTION write_room_messages(room_ids TEXT[], heads BIGINT[], new_heads BIGINT[], spare_heads BIGINT[],
	depths BIGINT[], event_ids TEXT[], event_types TEXT[], senders TEXT[], room_versions TEXT[], event_jsons TEXT[],
	snapshots BIGINT[], prevs TEXT[], txn_users TEXT[], txn_devices TEXT[], txn_paths TEXT[], now_ms BIGINT,
	target_idx INT[], targets TEXT[], channel TEXT, payload TEXT)
RETURNS TABLE (msg INT, outcome INT, at_pos BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
	n INT := COALESCE(array_length(room_ids, 1), 0);
	moved BOOLEAN[] := array_fill(false, ARRAY[n]);
	written INT := 0;
	v_pos BIGINT;
	v_nid BIGINT;
BEGIN
	FOR k IN 1..n LOOP
		IF txn_users[k] IS NOT NULL AND EXISTS (SELECT 1 FROM room_txns
				WHERE user_id = txn_users[k] AND device_id = txn_devices[k] AND txn_path = txn_paths[k]) THEN
			msg := k - 1; outcome := 2; at_pos := NULL;
			RETURN NEXT;
			CONTINUE;
		END IF;
		UPDATE rooms SET head = new_heads[k], depth = GREATEST(depth, depths[k])
			WHERE room_id = room_ids[k] AND head = heads[k];
		IF NOT FOUND THEN
			msg := k - 1; outcome := 1; at_pos := NULL;
			RETURN NEXT;
			CONTINUE;
		END IF;
		IF txn_users[k] IS NOT NULL THEN
			INSERT INTO room_txns (user_id, device_id, txn_path, event_id, created_ts)
				VALUES (txn_users[k], txn_devices[k], txn_paths[k], event_ids[k], now_ms)
				ON CONFLICT DO NOTHING;
			IF NOT FOUND THEN
				UPDATE rooms SET head = spare_heads[k] WHERE room_id = room_ids[k];
				msg := k - 1; outcome := 2; at_pos := NULL;
				RETURN NEXT;
				CONTINUE;
			END IF;
		END IF;
		moved[k] := true;
		written := written + 1;
	END LOOP;
	IF written = 0 THEN
		RETURN;
	END IF;
	UPDATE stream_position SET pos = pos + written WHERE id = 1 RETURNING pos - written INTO v_pos;
	FOR k IN 1..n LOOP
		CONTINUE WHEN NOT moved[k];
		v_pos := v_pos + 1;
		INSERT INTO room_events (event_id, room_id, event_type, sender, depth, room_version, event_json, state_before, state_after, pos)
			VALUES (event_ids[k], room_ids[k], event_types[k], senders[k], depths[k], room_versions[k], event_jsons[k],
				snapshots[k], snapshots[k], v_pos)
			RETURNING event_nid INTO v_nid;
		UPDATE room_extremities SET event_id = event_ids[k] WHERE room_id = room_ids[k] AND event_id = prevs[k];
		IF k - 1 = ANY (target_idx) THEN
			INSERT INTO outbound_pdus (destination, event_nid)
				SELECT d.destination, v_nid FROM unnest(target_idx, targets) AS d(i, destination) WHERE d.i = k - 1
				ORDER BY d.destination
				ON CONFLICT DO NOTHING;
		END IF;
		msg := k - 1; outcome := 0; at_pos := v_pos;
		RETURN NEXT;
	END LOOP;
	PERFORM pg_notify(channel, payload);
END
$$`
