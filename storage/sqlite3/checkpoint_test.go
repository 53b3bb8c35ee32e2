package sqlite3

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// walResets reads how many times the write-ahead log has started over:
// the checkpoint sequence number in its header.
func walResets(t *testing.T, path string) uint32 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var hdr [16]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		t.Fatalf("read log header: %v", err)
	}
	return binary.BigEndian.Uint32(hdr[12:])
}

// Under writes that never pause, a passive checkpoint never catches up
// with the log's end, so the log would only grow; the checkpointer's
// held-back step lets it start over again and again while the writes go on.
func TestCheckpointerStartsTheLogOverUnderSteadyWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k.db")
	// bigLog out of reach: only the held-back step can start the log over.
	d, err := open("file:"+path, pacing{interval: time.Millisecond, restartPages: 64, bigLog: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Write.Exec(`CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)`); err != nil {
		t.Fatal(err)
	}
	first := walResets(t, path+"-wal")

	var (
		stop    atomic.Bool
		written atomic.Int64
		wg      sync.WaitGroup
		werr    error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			d.LockWrites()
			_, err := d.Write.Exec(`INSERT INTO t (v) VALUES (randomblob(3000))`)
			d.UnlockWrites()
			if err != nil {
				werr = err
				return
			}
			written.Add(1)
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for walResets(t, path+"-wal") < first+3 {
		if time.Now().After(deadline) {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("the log started over %d times in 30 s of %d writes, want 3", walResets(t, path+"-wal")-first, written.Load())
		}
		time.Sleep(2 * time.Millisecond)
	}
	before := written.Load()
	// The writes went on meanwhile, and still do.
	for written.Load() < before+100 {
		if time.Now().After(deadline) {
			t.Fatalf("writes stalled at %d", written.Load())
		}
		time.Sleep(2 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	if werr != nil {
		t.Fatal(werr)
	}
	var n int64
	if err := d.Read.QueryRow(`SELECT COUNT(*) FROM t`).Scan(&n); err != nil || n != written.Load() {
		t.Fatalf("%d rows (%v), %d written", n, err, written.Load())
	}
}

// The write turn is handed on in the order writers asked for it, and a
// writer that has just had its turn, asking again at once, queues behind
// those already waiting instead of taking it back before they wake.
func TestWriteTurnsGoInOrder(t *testing.T) {
	turn := newWriteTurn()
	turn.lock()
	const n = 20
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			turn.lock()
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			turn.unlock()
		}()
		// Goroutine i is queued behind the ones before it before the
		// next one starts.
		waitBlockedOnTurn(t, i+1)
	}
	turn.unlock()
	turn.lock()
	mu.Lock()
	got := append([]int(nil), order...)
	mu.Unlock()
	turn.unlock()
	wg.Wait()
	if len(got) != n {
		t.Fatalf("the writer asking again took the turn after %d of the %d waiting", len(got), n)
	}
	for i, w := range got {
		if w != i {
			t.Fatalf("turns went %v", got)
		}
	}
}

// waitBlockedOnTurn waits until n goroutines are blocked taking a write turn.
func waitBlockedOnTurn(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		stacks := string(buf[:runtime.Stack(buf, true)])
		blocked := 0
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, "[chan send") && strings.Contains(g, "(*writeTurn).lock") {
				blocked++
			}
		}
		if blocked == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines blocked on the turn, want %d", blocked, n)
		}
		time.Sleep(time.Millisecond)
	}
}
