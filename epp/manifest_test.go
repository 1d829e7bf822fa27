package epp

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestManifestAppProtocol: the picker's Service names the protocol the
// Deployment serves on the ext_proc port. kubernetes.io/h2c is HTTP/2 in
// clear text (KEP-3726), wrong for --grpc-tls=self-signed or files: a
// gateway that takes the upstream protocol from appProtocol would speak
// plain h2 to a TLS port. GAIE's chart uses http2 (TLS or not).
func TestManifestAppProtocol(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "manifests", "gateway", "base", "epp.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	tlsMode, appProtocol := TLSSelfSigned, ""
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var doc struct {
			Kind string
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Name string
							Args []string
						}
					}
				}
				Ports []struct {
					TargetPort  any    `yaml:"targetPort"`
					AppProtocol string `yaml:"appProtocol"`
				}
			}
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		switch doc.Kind {
		case "Deployment":
			for _, c := range doc.Spec.Template.Spec.Containers {
				for _, a := range c.Args {
					if v, ok := strings.CutPrefix(a, "--grpc-tls="); ok && c.Name == "epp" {
						tlsMode = v
					}
				}
			}
		case "Service":
			for _, p := range doc.Spec.Ports {
				if p.TargetPort == "grpc" {
					appProtocol = p.AppProtocol
				}
			}
		}
	}
	want := "http2"
	if tlsMode == TLSOff {
		want = "kubernetes.io/h2c"
	}
	if appProtocol != want {
		t.Fatalf("Service kvmesh-epp grpc port: appProtocol %q with --grpc-tls=%s, want %q", appProtocol, tlsMode, want)
	}
}
