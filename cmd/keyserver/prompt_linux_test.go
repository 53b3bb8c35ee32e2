package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/sys/unix"

	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// openPTY opens a pseudo-terminal: the controlling side (what a user
// types into) and the terminal the command reads.
func openPTY(t *testing.T) (control, tty *os.File) {
	t.Helper()
	control, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { control.Close() })
	if err := unix.IoctlSetPointerInt(int(control.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(control.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	return control, tty
}

// syncBuffer is a bytes.Buffer safe to read while the command writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// At a terminal, create-user asks for the password twice with echo off,
// and what is typed is not shown.
func TestCreateUserPromptsAtATerminal(t *testing.T) {
	dir := t.TempDir()
	createUser := func(user, first, second string) error {
		t.Helper()
		control, tty := openPTY(t)
		// Whatever the terminal shows (echo included) is collected here.
		shown := &syncBuffer{}
		go func() { _, _ = io.Copy(shown, control) }()
		prompts := &syncBuffer{}
		done := make(chan error, 1)
		go func() {
			done <- run(context.Background(), []string{"admin", "create-user", "--data-dir", dir, "--server-name", "example.test",
				"--client-api-bcrypt-cost", "4", user}, tty, io.Discard, prompts)
		}()
		// typeAt waits for the prompt and for echo to be off, then types.
		typeAt := func(prompt, line string) {
			t.Helper()
			deadline := time.Now().Add(20 * time.Second)
			for {
				tio, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(prompts.String(), prompt) && tio.Lflag&unix.ECHO == 0 {
					break
				}
				select {
				case err := <-done:
					t.Fatalf("create-user ended before the prompt %q: %v (prompts %q)", prompt, err, prompts.String())
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("no prompt %q with echo off; prompts %q", prompt, prompts.String())
				}
				time.Sleep(time.Millisecond)
			}
			if _, err := control.WriteString(line + "\n"); err != nil {
				t.Fatal(err)
			}
		}
		typeAt("Password: ", first)
		typeAt("Password again: ", second)
		err := <-done
		if strings.Contains(shown.String(), first) || strings.Contains(shown.String(), second) {
			t.Errorf("the password was shown on the terminal: %q", shown.String())
		}
		return err
	}
	if err := createUser("erin", "erin's pw", "erin's pw"); err != nil {
		t.Fatal(err)
	}
	if err := createUser("frank", "one", "another"); err == nil || !strings.Contains(err.Error(), "differ") {
		t.Fatalf("different passwords: %v", err)
	}

	store, err := sqlstore.Open(context.Background(), "file:"+filepath.Join(dir, "keyserver.db"), "example.test")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	hash, err := store.PasswordHash(context.Background(), "@erin:example.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := bcrypt.CompareHashAndPassword([]byte(hash), []byte("erin's pw")); err != nil {
		t.Errorf("the stored password is not the one typed: %v", err)
	}
	if _, err := store.PasswordHash(context.Background(), "@frank:example.test"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("frank created although the passwords differed: %v", err)
	}
}
