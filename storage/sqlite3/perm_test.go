package sqlite3

import (
	"os"
	"path/filepath"
	"testing"
)

// fileModes reads the permissions of the database and its log files.
func fileModes(t *testing.T, path string) map[string]os.FileMode {
	t.Helper()
	out := map[string]os.FileMode{}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		out[filepath.Base(p)] = fi.Mode().Perm()
	}
	return out
}

// writeSomething makes SQLite create the log files.
func writeSomething(t *testing.T, d *DB) {
	t.Helper()
	if _, err := d.Write.Exec(`CREATE TABLE IF NOT EXISTS t (v TEXT); INSERT INTO t VALUES ('x')`); err != nil {
		t.Fatal(err)
	}
}

// The database and its log files are the owner's only, also in a
// directory that already existed with wider permissions.
func TestDatabaseFilesAreOwnerOnly(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "keys.db")
	d, err := Open("file:" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	writeSomething(t, d)
	for name, mode := range fileModes(t, path) {
		if mode != 0o600 {
			t.Errorf("%s created with mode %#o, want 0600", name, mode)
		}
	}
}

// A database left readable by others is narrowed when it is opened.
func TestExistingDatabaseIsNarrowed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.db")
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	writeSomething(t, d)
	// Leave the log files behind, as a crash would, all of them wide open.
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o664); err != nil {
			t.Fatal(err)
		}
	}
	d2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	defer d.Close()
	writeSomething(t, d2)
	for name, mode := range fileModes(t, path) {
		if mode != 0o600 {
			t.Errorf("%s left with mode %#o, want 0600", name, mode)
		}
	}
}
