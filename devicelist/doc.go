// Package devicelist tracks other servers' users' device lists: it
// fetches a list when a local client first needs it (Tracker.Lists),
// applies the m.device_list_update and m.signing_key_update EDUs other
// servers send, resyncs a list whose updates show a gap, and keeps the
// lists marked stale fresh in the background (Updater). The cache itself
// is the storage area storage.RemoteDeviceLists with its stale queue; the
// keys domain (package keyserver) answers /keys/query and claims from it
// through Tracker.Lists.
package devicelist
