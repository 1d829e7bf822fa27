// Package bootstrap makes the Secrets a kvmesh installation needs, once: the
// NATS users' passwords (one user per role, see manifests/base/nats.yaml) and
// the gossip encryption key. It runs as a Job at install (`kvmesh bootstrap`),
// so `kubectl apply -k manifests/install` is the whole install. It never
// overwrites a value that exists in the install's namespace (an operator's own
// Secret, or a rerun), and it copies the values engines' sidecars need into
// the engines' namespaces, bringing a copy it made (labelled managed-by
// kvmesh-bootstrap) in line when the source changed (a rotation, a
// reinstall); a differing copy it did not make is reported, not overwritten.
package bootstrap

import (
	"bytes"
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

// ManagedBy is the value of the label app.kubernetes.io/managed-by on the
// Secrets bootstrap creates: a copy in an engine namespace with it is kept
// equal to the source.
const ManagedBy = "kvmesh-bootstrap"

const managedByLabel = "app.kubernetes.io/managed-by"

// Result tells what Ensure did and found, as "namespace/secret[key]" entries.
type Result struct {
	// Created lists the values made now (generated, or copied where missing).
	Created []string
	// Updated lists the copies in engine namespaces set to the source's
	// value, which had changed (a rotation, a reinstall).
	Updated []string
	// Mismatched lists the copies that differ from the source and are not
	// bootstrap's (no managed-by label): left as they are; the sidecars
	// there do not hold the installation's credentials.
	Mismatched []string
}

// Ensure makes ns's Secrets (and, in each of sidecarNamespaces, the sidecars'
// subset with the same values) exist with every key, generating only what is
// missing in ns, and brings bootstrap's own copies in line with ns's values
// (res.Mismatched names the differing copies it did not make). Safe to rerun.
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
		for _, name := range []string{NATSSecret, GossipSecret} {
			if err := syncCopy(ctx, cs, other, name, sidecarKeys[name], src[name], &res); err != nil {
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
			Labels: map[string]string{"app.kubernetes.io/part-of": "kvmesh", managedByLabel: ManagedBy}},
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
		_, err = api.Create(ctx, s, metav1.CreateOptions{FieldManager: ManagedBy})
	} else {
		_, err = api.Update(ctx, s, metav1.UpdateOptions{FieldManager: ManagedBy})
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

// syncCopy makes ns/name hold keys with src's values: a missing Secret is
// created (labelled managed-by kvmesh-bootstrap), a missing key filled, and
// a differing value set to the source's when the Secret is bootstrap's, or
// reported in res.Mismatched when it is not.
func syncCopy(ctx context.Context, cs kubernetes.Interface, ns, name string, keys []string, src map[string][]byte, res *Result) error {
	api := cs.CoreV1().Secrets(ns)
	s, err := api.Get(ctx, name, metav1.GetOptions{})
	create := apierrors.IsNotFound(err)
	if err != nil && !create {
		return fmt.Errorf("get secret %s/%s: %w", ns, name, err)
	}
	if create {
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/part-of": "kvmesh", managedByLabel: ManagedBy}},
			Type: corev1.SecretTypeOpaque}
	}
	managed := s.Labels[managedByLabel] == ManagedBy
	data := maps.Clone(s.Data)
	if data == nil {
		data = map[string][]byte{}
	}
	var added, updated, mismatched []string
	for _, k := range keys {
		entry := fmt.Sprintf("%s/%s[%s]", ns, name, k)
		switch {
		case len(data[k]) == 0:
			data[k] = src[k]
			added = append(added, entry)
		case bytes.Equal(data[k], src[k]):
		case managed:
			data[k] = src[k]
			updated = append(updated, entry)
		default:
			mismatched = append(mismatched, entry)
		}
	}
	if len(added)+len(updated) > 0 {
		s.Data = data
		if create {
			_, err = api.Create(ctx, s, metav1.CreateOptions{FieldManager: ManagedBy})
		} else {
			_, err = api.Update(ctx, s, metav1.UpdateOptions{FieldManager: ManagedBy})
		}
		if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
			return syncCopy(ctx, cs, ns, name, keys, src, res) // written meanwhile: look again
		}
		if err != nil {
			return fmt.Errorf("write secret %s/%s: %w", ns, name, err)
		}
	}
	res.Created = append(res.Created, added...)
	res.Updated = append(res.Updated, updated...)
	res.Mismatched = append(res.Mismatched, mismatched...)
	return nil
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
