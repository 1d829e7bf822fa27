package local

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// Status is what the orchestrator reports after every step.
type Status struct {
	Time        time.Time          `json:"time"`
	Gossip      string             `json:"gossip"`            // the seed address to join the mesh
	NATS        string             `json:"nats"`              // NATS URL
	Ingress     string             `json:"ingress,omitempty"` // http://host:port
	IngressPID  int                `json:"ingressPID,omitempty"`
	Deployments []DeploymentStatus `json:"deployments"`
	// Recovered lists the restarts of this step.
	Recovered []string `json:"recovered,omitempty"`
	// Rolled lists the replicas recreated this step from a changed spec.
	Rolled []string `json:"rolled,omitempty"`
}

// DeploymentStatus is one ModelDeployment.
type DeploymentStatus struct {
	Name   string        `json:"name"`
	Roles  []RoleStatus  `json:"roles"`
	Policy *PolicyStatus `json:"policy,omitempty"`
}

// RoleStatus is one role: desired (the policy's decision, else the spec's
// replicas), started and ready (in the mesh and ready) replicas.
type RoleStatus struct {
	Name     string             `json:"name"`
	Kind     string             `json:"kind"`
	Desired  int32              `json:"desired"`
	Replicas int32              `json:"replicas"`
	Ready    int32              `json:"ready"`
	Reason   string             `json:"reason,omitempty"`
	Engines  []EngineStatus     `json:"engines"`
	Load     map[string]float64 `json:"load,omitempty"`
}

// EngineStatus is one replica.
type EngineStatus struct {
	ID         string `json:"id"`
	URL        string `json:"url"`
	SimPID     int    `json:"simPID"`
	SidecarPID int    `json:"sidecarPID"`
	Ready      bool   `json:"ready"`
	Draining   bool   `json:"draining,omitempty"`
	Restarts   int    `json:"restarts,omitempty"`
}

// PolicyStatus is the AutoscalingPolicy's last step.
type PolicyStatus struct {
	Name string `json:"name"`
	// Ratio is numerator/denominator desired replicas (0 when either is 0).
	Ratio       float64    `json:"ratio,omitempty"`
	RatioBand   [2]float64 `json:"ratioBand,omitempty"`
	RatioReason string     `json:"ratioReason,omitempty"`
	Conditions  []string   `json:"conditions,omitempty"`
}

// PIDs lists every child process id in s (tests check none outlives Run).
func (s Status) PIDs() []int {
	var out []int
	if s.IngressPID != 0 {
		out = append(out, s.IngressPID)
	}
	for _, d := range s.Deployments {
		for _, r := range d.Roles {
			for _, e := range r.Engines {
				out = append(out, e.SimPID, e.SidecarPID)
			}
		}
	}
	return out
}

// Role finds a role's status.
func (s Status) Role(deployment, role string) (RoleStatus, bool) {
	for _, d := range s.Deployments {
		if d.Name != deployment {
			continue
		}
		for _, r := range d.Roles {
			if r.Name == role {
				return r, true
			}
		}
	}
	return RoleStatus{}, false
}

// WriteText writes one line per role (and the ratio and restarts): the
// plain status an operator tails.
func (s Status) WriteText(w io.Writer) error {
	var b strings.Builder
	for _, d := range s.Deployments {
		for _, r := range d.Roles {
			fmt.Fprintf(&b, "%s/%s (%s): desired %d, replicas %d, ready %d", d.Name, r.Name, r.Kind, r.Desired, r.Replicas, r.Ready)
			if r.Reason != "" {
				fmt.Fprintf(&b, " (%s)", r.Reason)
			}
			b.WriteByte('\n')
		}
		if p := d.Policy; p != nil && p.RatioReason != "" {
			fmt.Fprintf(&b, "%s: ratio %.2f in [%.2f, %.2f]: %s\n", d.Name, p.Ratio, p.RatioBand[0], p.RatioBand[1], p.RatioReason)
		}
	}
	for _, r := range s.Recovered {
		fmt.Fprintf(&b, "recovered %s\n", r)
	}
	for _, r := range s.Rolled {
		fmt.Fprintf(&b, "rolled %s\n", r)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeStatusFile replaces path atomically.
func writeStatusFile(path string, s Status) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".kvmesh-status-*")
	if err != nil {
		return fmt.Errorf("status file: %w", err)
	}
	_, werr := tmp.Write(append(b, '\n'))
	cerr := tmp.Close()
	if werr != nil || cerr != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("status file: %v %v", werr, cerr)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("status file: %w", err)
	}
	return nil
}

// roleStatus builds a role's status from the supervisor and the mesh.
func roleStatus(md *v1alpha1.ModelDeployment, r *v1alpha1.Role, desired int32, reason string, reps []ReplicaInfo, engines map[string]gossip.EngineView) RoleStatus {
	rs := RoleStatus{Name: r.Name, Kind: string(r.Kind), Desired: desired, Reason: reason, Load: map[string]float64{}}
	for _, e := range reps {
		if e.Deployment != md.Name || e.Role != r.Name {
			continue
		}
		v, inMesh := engines[e.ID]
		ready := inMesh && v.Ready && !e.Draining
		rs.Engines = append(rs.Engines, EngineStatus{ID: e.ID, URL: e.URL, SimPID: e.SimPID, SidecarPID: e.SidecarPID,
			Ready: ready, Draining: e.Draining, Restarts: e.Restarts})
		if e.Draining {
			continue
		}
		rs.Replicas++
		if ready {
			rs.Ready++
		}
		if inMesh {
			rs.Load["running"] += float64(v.Running)
			rs.Load["waiting"] += float64(v.Waiting)
		}
	}
	sort.Slice(rs.Engines, func(i, j int) bool { return rs.Engines[i].ID < rs.Engines[j].ID })
	return rs
}
