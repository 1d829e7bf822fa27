package manifests

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/orchestrator/webhook"
)

// images returns every container image named in the YAML documents of b
// (any "image" key holding a string, at any depth).
func images(t *testing.T, name string, b []byte) []string {
	t.Helper()
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if s, ok := e.(string); ok && k == "image" {
					out = append(out, s)
				} else {
					walk(e)
				}
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	dec := yaml.NewDecoder(bytesReader(b))
	for {
		var doc any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		walk(doc)
	}
	return out
}

// manifestImages maps every YAML file under manifests/ to the images it names.
func manifestImages(t *testing.T) map[string][]string {
	t.Helper()
	all := map[string][]string{}
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		all[p] = images(t, p, b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// TestKvmeshImagesArePinned: every kvmesh image the manifests name, in their
// files and as every kustomization renders them, is webhook.DefaultImage,
// the one the orchestrator injects when it cannot read its own: one explicit
// tag, never :latest (a floating tag lets nodes, sidecars and ingresses run
// different builds of one release), so that `kustomize edit set image` in an
// overlay moves them all together (docs/INSTALL.md, section 1).
func TestKvmeshImagesArePinned(t *testing.T) {
	if strings.HasSuffix(webhook.DefaultImage, ":latest") || !strings.HasPrefix(webhook.DefaultImage, webhook.ImageRepository+":v") {
		t.Fatalf("webhook.DefaultImage %q: want %s:vX.Y.Z", webhook.DefaultImage, webhook.ImageRepository)
	}
	check := func(where, img string) bool {
		if !strings.Contains(img, "kvmesh/kvmesh") {
			return false
		}
		if img != webhook.DefaultImage {
			t.Errorf("%s names %s, want %s (webhook.DefaultImage)", where, img, webhook.DefaultImage)
		}
		return true
	}
	files := 0
	for p, imgs := range manifestImages(t) {
		for _, img := range imgs {
			if !strings.Contains(img, ":") || strings.HasSuffix(img, ":latest") {
				t.Errorf("%s names %s: no explicit tag", p, img)
			}
			if check(p, img) {
				files++
			}
		}
	}
	// orchestrator, base (ingress, bootstrap), the daemonset's and the written sidecar, the picker.
	if files < 6 {
		t.Errorf("only %d kvmesh images found in the manifests' files: the walk no longer finds them", files)
	}
	kc := kubectl(t)
	for _, dir := range kustomizations(t) {
		for _, o := range render(t, kc, dir) {
			b, err := o.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			for _, img := range images(t, dir, b) {
				check(dir+": "+o.GetKind()+" "+o.GetName(), img)
			}
		}
	}
}

// TestNATSImageIsTheEmbeddedServer: base/nats.yaml runs the nats-server
// release that go.mod requires, the one every test of the mesh runs embedded
// (and this test is linked with): a server upgraded in go.mod alone would
// leave the manifests on a release the tests no longer exercise.
func TestNATSImageIsTheEmbeddedServer(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?github\.com/nats-io/nats-server/v2 v(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod requires no github.com/nats-io/nats-server/v2")
	}
	version := string(m[1])
	if version != server.VERSION {
		t.Errorf("go.mod requires nats-server v%s, the linked server reports %s", version, server.VERSION)
	}
	var nats []string
	for _, img := range manifestImages(t)[filepath.Join("base", "nats.yaml")] {
		if strings.HasPrefix(img, "nats:") {
			nats = append(nats, img)
		}
	}
	want := "nats:" + version + "-alpine"
	if len(nats) == 0 {
		t.Fatal("base/nats.yaml names no nats image")
	}
	for _, img := range nats {
		if img != want {
			t.Errorf("base/nats.yaml runs %s, go.mod embeds nats-server v%s: want %s", img, version, want)
		}
	}
}
