package auth

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseKeys(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []Entry
		wantErr error
	}{
		{name: "empty", in: "", want: nil},
		{name: "comments and blanks", in: "# team keys\n\n   \n# end\n", want: nil},
		{name: "named", in: "alice sk-alice-0001\nbob\tsk-bob-00000002\n",
			want: []Entry{{Name: "alice", Key: "sk-alice-0001"}, {Name: "bob", Key: "sk-bob-00000002"}}},
		{name: "unnamed gets derived name", in: "sk-anon-123456",
			want: []Entry{{Name: DerivedName("sk-anon-123456"), Key: "sk-anon-123456"}}},
		{name: "comma separated (env form)", in: "alice sk-alice-0001, sk-anon-123456 ,",
			want: []Entry{{Name: "alice", Key: "sk-alice-0001"}, {Name: DerivedName("sk-anon-123456"), Key: "sk-anon-123456"}}},
		{name: "crlf", in: "alice sk-alice-0001\r\n", want: []Entry{{Name: "alice", Key: "sk-alice-0001"}}},
		{name: "short key", in: "alice short", wantErr: ErrMalformed},
		{name: "three fields", in: "alice sk-alice-0001 extra", wantErr: ErrMalformed},
		{name: "bad name byte", in: "al/ice sk-alice-0001", wantErr: ErrMalformed},
		{name: "reserved name", in: "anonymous sk-alice-0001", wantErr: ErrMalformed},
		{name: "non-ascii key", in: "alice sk-alicé-0001", wantErr: ErrMalformed},
		{name: "duplicate key", in: "alice sk-same-0001\nbob sk-same-0001", wantErr: ErrDuplicateKey},
		{name: "duplicate name", in: "alice sk-alice-0001\nalice sk-alice-0002", wantErr: ErrDuplicateName},
		{name: "long line", in: strings.Repeat("x", maxLineLen+10), wantErr: ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseKeys(strings.NewReader(tt.in))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if got != nil {
					t.Fatalf("entries returned with an error: %v", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("entry %d = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestParseKeysReportsEveryProblem(t *testing.T) {
	_, err := ParseKeys(strings.NewReader("alice short\nbob sk-bob-00000002\nb/d sk-bad-00000003\n"))
	if err == nil {
		t.Fatal("want error")
	}
	for _, want := range []string{"line 1", "line 3"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "sk-bob") || strings.Contains(err.Error(), "short") {
		t.Errorf("error leaks a key: %q", err)
	}
}

func TestCheck(t *testing.T) {
	s := NewStore([]Entry{{Name: "alice", Key: "sk-alice-0001"}, {Name: "bob", Key: "sk-bob-00000002"}})
	tests := []struct {
		header  string
		want    string
		wantErr error
	}{
		{"Bearer sk-alice-0001", "alice", nil},
		{"bearer sk-bob-00000002", "bob", nil},
		{"BEARER   sk-bob-00000002  ", "bob", nil},
		{"", "", ErrMissingKey},
		{"Bearer ", "", ErrMissingKey},
		{"Basic sk-alice-0001", "", ErrMissingKey},
		{"sk-alice-0001", "", ErrMissingKey},
		{"Bearer sk-alice-0002", "", ErrInvalidKey},
		{"Bearer sk-alice-000", "", ErrInvalidKey},
		{"Bearer sk-alice-00011", "", ErrInvalidKey},
	}
	for _, tt := range tests {
		got, err := s.Check([]byte(tt.header))
		if !errors.Is(err, tt.wantErr) || got != tt.want {
			t.Errorf("Check(%q) = %q, %v; want %q, %v", tt.header, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !errors.Is(err, ErrUnauthorized) {
			t.Errorf("Check(%q) error %v does not wrap ErrUnauthorized", tt.header, err)
		}
	}
}

func TestDisabledStoreAdmitsAnonymous(t *testing.T) {
	for _, s := range []*Store{nil, NewStore(nil)} {
		if s.Enabled() {
			t.Fatal("empty store enabled")
		}
		got, err := s.Check(nil)
		if err != nil || got != Anonymous {
			t.Fatalf("Check = %q, %v; want anonymous", got, err)
		}
	}
}

func TestLoadMergesFileAndEnv(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	if err := os.WriteFile(file, []byte("alice sk-alice-0001\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEST_KVMESH_KEYS", "bob sk-bob-00000002,sk-carol-000003")
	s, err := Load(Config{KeysFile: file, EnvVar: "TEST_KVMESH_KEYS"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 3 {
		t.Fatalf("Len = %d, want 3", s.Len())
	}
	for header, want := range map[string]string{
		"Bearer sk-alice-0001":   "alice",
		"Bearer sk-bob-00000002": "bob",
		"Bearer sk-carol-000003": DerivedName("sk-carol-000003"),
	} {
		if got, err := s.Check([]byte(header)); err != nil || got != want {
			t.Errorf("Check(%q) = %q, %v; want %q", header, got, err, want)
		}
	}

	t.Setenv("TEST_KVMESH_KEYS", "alice sk-alice-0001")
	if _, err := Load(Config{KeysFile: file, EnvVar: "TEST_KVMESH_KEYS"}); !errors.Is(err, ErrDuplicateKey) {
		t.Fatalf("duplicate across sources: err = %v", err)
	}
}

func TestLoadConfigErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := Load(Config{KeysFile: filepath.Join(dir, "missing"), EnvVar: "A B"})
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "keys file") || !strings.Contains(err.Error(), "env var") {
		t.Fatalf("want both problems listed, got %v", err)
	}
	if _, err := Load(Config{KeysFile: dir}); !errors.Is(err, ErrConfig) {
		t.Fatalf("directory: err = %v", err)
	}
	t.Setenv("TEST_KVMESH_EMPTY", "")
	if _, err := Load(Config{EnvVar: "TEST_KVMESH_EMPTY", Required: true}); !errors.Is(err, ErrConfig) {
		t.Fatalf("required without keys: err = %v", err)
	}
	s, err := Load(Config{EnvVar: "-"})
	if err != nil || s.Enabled() {
		t.Fatalf("env disabled: %v, enabled=%v", err, s.Enabled())
	}
}

func FuzzParseKeys(f *testing.F) {
	for _, seed := range []string{
		"", "alice sk-alice-0001\n", "# c\nsk-anon-123456", "a b c", "x sk-1\r\n,,", "alice sk-a-000001, bob sk-b-000002",
		"anonymous sk-000000000", "\x00\xff sk-\x01",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		entries, err := ParseKeys(strings.NewReader(in))
		if err != nil {
			return
		}
		s := NewStore(entries)
		if s.Len() != len(entries) {
			t.Fatalf("store has %d keys, parsed %d", s.Len(), len(entries))
		}
		for _, e := range entries {
			if validKey(e.Key) != nil || validName(e.Name) != nil && !strings.HasPrefix(e.Name, "key-") {
				t.Fatalf("accepted invalid entry %+v", e)
			}
			got, err := s.Check([]byte("Bearer " + e.Key))
			if err != nil || got != e.Name {
				t.Fatalf("parsed key does not authenticate: %q, %v", got, err)
			}
		}
	})
}

func BenchmarkCheck(b *testing.B) {
	entries := make([]Entry, 0, 1000)
	for i := 0; i < 1000; i++ {
		k := "sk-bench-" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('A'+i/26%26)) + string(rune('0'+i/676))
		entries = append(entries, Entry{Name: DerivedName(k), Key: k})
	}
	s := NewStore(entries)
	hdr := []byte("Bearer " + entries[500].Key)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.Check(hdr); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLoadNamesTheSource checks a problem names the file or variable it is in, so an
// operator with keys in both knows which to mend.
func TestLoadNamesTheSource(t *testing.T) {
	file := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(file, []byte("alice sk-alice-0001\nbob short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEST_KVMESH_KEYS", "carol sk-carol-0003,alice sk-alice-0001")
	_, err := Load(Config{KeysFile: file, EnvVar: "TEST_KVMESH_KEYS"})
	if err == nil {
		t.Fatal("Load accepted a short key and a duplicate")
	}
	for _, want := range []string{
		file + " line 2: ",
		"$TEST_KVMESH_KEYS line 1: duplicate key (first on " + file + " line 1)",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}
