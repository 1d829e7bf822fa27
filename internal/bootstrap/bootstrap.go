// Package bootstrap makes the Secrets a kvmesh installation needs, once: the
// NATS users' passwords (one user per role, see manifests/base/nats.yaml) and
// the gossip encryption key. It runs as a Job at install (`kvmesh bootstrap`),
// so `kubectl apply -k manifests/install` is the whole install. It never
// overwrites a value that exists (an operator's own Secret, or a rerun), and
// it copies the values engines' sidecars need into the engines' namespaces.
package bootstrap

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The Secrets and their keys.
const (
	NATSSecret   = "kvmesh-nats"
	GossipSecret = "kvmesh-gossip"
)

// natsKeys are kvmesh-nats's keys; sidecarKeys are what a sidecar's namespace needs.
var (
	natsKeys    = []string{"sidecar-password", "ingress-password", "admin-password", "sys-password"}
	sidecarKeys = map[string][]string{NATSSecret: {"sidecar-password"}, GossipSecret: {"key"}}
)

// Result tells what Ensure did.
type Result struct {
	// Created and Filled list "namespace/secret[key]" entries made now.
	Created []string
}

// Ensure makes ns's Secrets (and, in each of sidecarNamespaces, the sidecars'
// subset with the same values) exist with every key, generating only what is
// missing. Safe to rerun.
func Ensure(ctx context.Context, cs kubernetes.Interface, ns string, sidecarNamespaces []string) (Result, error) {
	var res Result
	nats, err := ensure(ctx, cs, ns, NATSSecret, natsKeys, func(string) ([]byte, error) { return random(24) }, &res)
	if err != nil {
		return res, err
	}
	gossip, err := ensure(ctx, cs, ns, GossipSecret, []string{"key"}, func(string) ([]byte, error) {
		k, err := randomRaw(32)
		return []byte(base64.StdEncoding.EncodeToString(k)), err
	}, &res)
	if err != nil {
		return res, err
	}
	src := map[string]map[string][]byte{NATSSecret: nats, GossipSecret: gossip}
	for _, other := range sidecarNamespaces {
		if other == ns || other == "" {
			continue
		}
		for name, keys := range sidecarKeys {
			if _, err := ensure(ctx, cs, other, name, keys, func(k string) ([]byte, error) { return src[name][k], nil }, &res); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// ensure gets or creates ns/name and fills its missing keys with gen; it
// returns the Secret's data.
func ensure(ctx context.Context, cs kubernetes.Interface, ns, name string, keys []string, gen func(key string) ([]byte, error), res *Result) (map[string][]byte, error) {
	api := cs.CoreV1().Secrets(ns)
	s, err := api.Get(ctx, name, metav1.GetOptions{})
	create := apierrors.IsNotFound(err)
	if err != nil && !create {
		return nil, fmt.Errorf("get secret %s/%s: %w", ns, name, err)
	}
	if create {
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/part-of": "kvmesh", "app.kubernetes.io/managed-by": "kvmesh-bootstrap"}},
			Type: corev1.SecretTypeOpaque}
	}
	data := maps.Clone(s.Data)
	if data == nil {
		data = map[string][]byte{}
	}
	var added []string
	for _, k := range keys {
		if len(data[k]) > 0 {
			continue
		}
		v, err := gen(k)
		if err != nil {
			return nil, err
		}
		data[k] = v
		added = append(added, k)
	}
	if len(added) == 0 {
		return data, nil
	}
	s.Data = data
	if create {
		_, err = api.Create(ctx, s, metav1.CreateOptions{FieldManager: "kvmesh-bootstrap"})
	} else {
		_, err = api.Update(ctx, s, metav1.UpdateOptions{FieldManager: "kvmesh-bootstrap"})
	}
	if err != nil {
		// A conflict means another bootstrap ran at once: its values stand; read them.
		if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
			return ensure(ctx, cs, ns, name, keys, gen, res)
		}
		return nil, fmt.Errorf("write secret %s/%s: %w", ns, name, err)
	}
	for _, k := range added {
		res.Created = append(res.Created, fmt.Sprintf("%s/%s[%s]", ns, name, k))
	}
	return data, nil
}

// random returns n random bytes as URL-safe text (a password).
func random(n int) ([]byte, error) {
	b, err := randomRaw(n)
	if err != nil {
		return nil, err
	}
	return []byte(base64.RawURLEncoding.EncodeToString(b)), nil
}

func randomRaw(n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("random: %w", err)
	}
	return b, nil
}
