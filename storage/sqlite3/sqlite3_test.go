package sqlite3

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The writer never checkpoints; the background does: passively as the log
// grows, and truncating it once it passes its bound.
func TestLogIsCheckpointedInTheBackground(t *testing.T) {
	checkpointEvery, maxWALBytes = 20*time.Millisecond, 1<<20
	t.Cleanup(func() { checkpointEvery, maxWALBytes = time.Second, 64<<20 })
	path := filepath.Join(t.TempDir(), "k.db")
	db, err := Open("file:" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var auto int
	if err := db.Write.QueryRow(`PRAGMA wal_autocheckpoint`).Scan(&auto); err != nil || auto != 0 {
		t.Fatalf("the writer's wal_autocheckpoint is %d (%v), want 0", auto, err)
	}
	if _, err := db.Write.Exec(`CREATE TABLE t (v BLOB)`); err != nil {
		t.Fatal(err)
	}
	size := func(p string) int64 {
		fi, err := os.Stat(p)
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	row := []byte(strings.Repeat("x", 4000))
	for i := 0; i < 600; i++ { // about 2.4 MB of log
		if _, err := db.Write.Exec(`INSERT INTO t (v) VALUES (?)`, row); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for size(path) < 2<<20 || size(path+"-wal") > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s the database holds %d bytes and the log %d; want the rows checkpointed and the log truncated",
				size(path), size(path+"-wal"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
