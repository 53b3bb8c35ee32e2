package media

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// files keeps media bytes under a directory, each file named by the
// SHA-256 of its content (aa/bb/aabb...). A file is written under tmp/,
// synced, and renamed into place: a name under the directory always has
// its whole content, so nothing half-written is ever served, and the same
// bytes uploaded twice are kept once.
type files struct{ dir string }

// errTooLarge and errShortBody are put's errors of the content itself.
var (
	errTooLarge  = errors.New("content larger than the limit")
	errShortBody = errors.New("content ended early")
)

func (f files) path(sha string) string {
	return filepath.Join(f.dir, sha[:2], sha[2:4], sha)
}

// put stores what r holds, at most max bytes (errTooLarge beyond), and
// returns its hex SHA-256 and size. A read error is errShortBody.
func (f files) put(r io.Reader, max int64) (sha string, size int64, err error) {
	tmpDir := filepath.Join(f.dir, "tmp")
	if err := os.MkdirAll(tmpDir, 0o700); err != nil {
		return "", 0, err
	}
	tmp, err := os.CreateTemp(tmpDir, "upload-*")
	if err != nil {
		return "", 0, err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	size, err = io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, max+1))
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) { // the write to the file, not the read
			return "", 0, err
		}
		return "", 0, fmt.Errorf("%w: %v", errShortBody, err)
	}
	if size > max {
		return "", 0, errTooLarge
	}
	if err = tmp.Sync(); err != nil {
		return "", 0, err
	}
	if err = tmp.Close(); err != nil {
		return "", 0, err
	}
	sha = hex.EncodeToString(h.Sum(nil))
	final := f.path(sha)
	if err = os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
		return "", 0, err
	}
	if err = os.Rename(tmp.Name(), final); err != nil {
		return "", 0, err
	}
	return sha, size, nil
}

// open opens the file of a digest.
func (f files) open(sha string) (*os.File, error) {
	if len(sha) != 64 {
		return nil, fmt.Errorf("bad media digest %q", sha)
	}
	if _, err := hex.DecodeString(sha); err != nil {
		return nil, fmt.Errorf("bad media digest %q", sha)
	}
	return os.Open(f.path(sha))
}
