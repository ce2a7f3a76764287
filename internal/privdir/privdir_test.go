package privdir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEnsureCreatesPrivateDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "run")
	if err := Ensure(dir); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Dir(dir)} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("%s has mode %v, want 0700", d, fi.Mode().Perm())
		}
	}
	if err := Ensure(dir); err != nil {
		t.Errorf("an existing private directory: %v", err)
	}
}

func TestEnsureRefusesUntrustedDirectories(t *testing.T) {
	base := t.TempDir()
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o755)
	link := filepath.Join(base, "link")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ dir, want string }{
		{open, "must be 0700"},
		{link, "symbolic link"},
		{file, "not a directory"},
	} {
		err := Ensure(c.dir)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Ensure(%s) = %v, want an error saying %q", c.dir, err, c.want)
		}
	}
	if os.Geteuid() == 0 {
		// Root can make a directory that belongs to someone else.
		other := filepath.Join(base, "other")
		if err := os.Mkdir(other, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := Ensure(other); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
			t.Errorf("Ensure of another user's directory = %v", err)
		}
	}
}

func TestWriteFileNeverFollowsSymlinks(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "worker-0.json")
	// A planted symlink at the temporary name and one at the final name.
	if err := os.Symlink(victim, path+".tmp"); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, []byte("config")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "secret" {
		t.Fatalf("the symlink's target was written: %q", b)
	}
	if b, _ := os.ReadFile(path); string(b) != "config" {
		t.Fatalf("file holds %q", b)
	}
	os.Remove(path)
	if err := os.Symlink(victim, path); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenFile(path, os.O_RDWR|os.O_CREATE); err == nil {
		t.Fatal("OpenFile followed a symlink")
	}
	fi, err := os.Stat(victim)
	if err != nil || fi.Size() != int64(len("secret")) {
		t.Fatalf("victim changed: %v %v", fi, err)
	}
}
