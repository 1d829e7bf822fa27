package orchestrator

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// slot identifies one pod of a deployment: group g, role r, replica i,
// member m (0 is the leader, 1..count the workers).
type slot struct {
	Group   int
	Role    string
	Replica int
	Member  int
}

// podName is the deterministic name of a slot's pod.
func podName(md string, s slot) string {
	n := fmt.Sprintf("%s-%d-%s-%d", md, s.Group, s.Role, s.Replica)
	if s.Member > 0 {
		n += "-w" + strconv.Itoa(s.Member)
	}
	return n
}

// nameProblems says why the controller cannot make md's objects from its
// names (nil: it can): the headless Service takes the deployment's name (a
// DNS-1035 label), and every pod's name, also its hostname, must be a DNS
// label at the largest indexes the schema allows; pdGroupLabel is a label
// key of every pod. The CRD refuses such names at admission; this catches a
// deployment admitted before it did.
func nameProblems(md *v1alpha1.ModelDeployment) []string {
	var probs []string
	for _, p := range validation.IsDNS1035Label(md.Name) {
		probs = append(probs, fmt.Sprintf("name %q: %s", md.Name, p))
	}
	if len(probs) > 0 {
		return probs // every pod name would be refused for the same reason
	}
	for _, p := range validation.IsQualifiedName(md.Spec.PDGroupLabel) {
		probs = append(probs, fmt.Sprintf("pdGroupLabel %q is no label key: %s", md.Spec.PDGroupLabel, p))
	}
	if reservedLabelKey(md.Spec.PDGroupLabel) {
		probs = append(probs, fmt.Sprintf("pdGroupLabel %q is under %s, the prefix of the controller's own pod labels (only %s may be used)",
			md.Spec.PDGroupLabel, v1alpha1.LabelPrefix, v1alpha1.DefaultPDGroupLabel))
	}
	for _, r := range md.Spec.Roles {
		longest := podName(md.Name, slot{Group: v1alpha1.MaxGroups - 1, Role: r.Name, Replica: v1alpha1.MaxReplicas - 1, Member: v1alpha1.MaxWorkers})
		if len(md.Name)+len(r.Name) > v1alpha1.MaxNamesLength || len(validation.IsDNS1123Label(longest)) > 0 {
			probs = append(probs, fmt.Sprintf("role %s: pod names such as %s are longer than a hostname may be (63): the deployment's and the role's names may hold %d characters together, not %d",
				r.Name, longest, v1alpha1.MaxNamesLength, len(md.Name)+len(r.Name)))
		}
	}
	return probs
}

// reservedLabelKey: key is under the prefix of the labels the controller
// writes on its pods (kvmesh.io/deployment, group, role, replica, worker,
// revision, inject, ...), other than the default P/D group label. Such a
// pdGroupLabel would overwrite one of them: a pod whose slot or revision
// label is the group's name is deleted and recreated forever, one whose
// deployment label is leaves the selector and is orphaned. The CRD refuses
// it with the same rule.
func reservedLabelKey(key string) bool {
	return strings.HasPrefix(key, v1alpha1.LabelPrefix) && key != v1alpha1.DefaultPDGroupLabel
}

// slotOf reads a pod's slot from its labels; ok is false for a pod that
// lacks them or whose indexes are not as the controller writes them (a
// nonnegative decimal without sign or leading zeros): such a pod is a stray
// (deleted as an Orphan), not a slot below 0 that no scale-down reaches, nor
// a second pod for the slot "1" spelled "01" or "+1".
func slotOf(p *corev1.Pod) (slot, bool) {
	l := p.Labels
	g, ok1 := slotIndex(l[v1alpha1.LabelGroup])
	i, ok2 := slotIndex(l[v1alpha1.LabelReplica])
	m, ok3 := slotIndex(l[v1alpha1.LabelWorker])
	r := l[v1alpha1.LabelRole]
	if !ok1 || !ok2 || !ok3 || r == "" {
		return slot{}, false
	}
	return slot{Group: g, Role: r, Replica: i, Member: m}, true
}

// slotIndex reads an index label written by strconv.Itoa (pods.go).
func slotIndex(v string) (int, bool) {
	n, err := strconv.Atoi(v)
	return n, err == nil && n >= 0 && strconv.Itoa(n) == v
}

// revision hashes what a role's pods are made from: a change rolls the role.
// That is everything buildPod renders from the spec: the role's templates,
// workers and kind, and of the deployment the model (KVMESH_MODEL, the
// kvmesh.io/model annotation), the engine (the P/D protocol annotation), the
// P/D group label (label, annotation) and the sidecar mode (the inject
// label). The names (deployment, role, namespace) make the pods' names, so a
// pod made from other ones is not in the slot.
func revision(md *v1alpha1.ModelDeployment, r *v1alpha1.Role) string {
	h := fnv.New64a()
	b, _ := json.Marshal(struct {
		T      corev1.PodTemplateSpec
		W      *v1alpha1.Workers
		K      v1alpha1.RoleKind
		Model  string
		Engine v1alpha1.EngineKind
		PD     string
		Mode   v1alpha1.SidecarMode
	}{r.Template, r.Workers, r.Kind, md.Spec.Model, md.Spec.Engine, md.Spec.PDGroupLabel, md.Spec.Sidecar.Mode})
	h.Write(b)
	return strconv.FormatUint(h.Sum64(), 36)
}

// plan is one reconcile's step: pods to delete (with why) and slots to
// create. Gang holds the slots of new groups that must all be created or
// none.
type plan struct {
	Delete []deletion
	Create []slot
	// Gang maps a new group to the slots of its gang minimum.
	Gang map[int][]slot
	// Rolled counts outdated replicas deleted for a rollout, per role.
	Rolled map[string]int
	// Recovered names the recovery actions taken ("group 1", "role decode/0").
	Recovered []string
	// Complete are the pods to mark v1alpha1.AnnotationReplicaComplete:
	// members of a replica whole and Running that lack the mark.
	Complete []*corev1.Pod
}

type deletion struct {
	Pod    *corev1.Pod
	Reason string
}

// Reasons for deleting a pod.
const (
	reasonScaleDown = "ScaleDown"
	reasonRecover   = "Recover"
	reasonRollout   = "RollingUpdate"
	reasonUnknown   = "Orphan"
)

// podView is what the plan needs of one existing pod.
type podView struct {
	Pod      *corev1.Pod
	Slot     slot
	Ready    bool
	Failed   bool
	Revision string
}

// state indexes a deployment's existing pods by slot.
type state struct {
	bySlot map[slot]*podView
	groups map[int]bool
	// byReplica holds each replica's pods (the key's Member is 0), any
	// member index, also one beyond the role's current workers.
	byReplica map[slot][]*podView
}

func newState(pods []*corev1.Pod) (*state, []*corev1.Pod) {
	st := &state{bySlot: map[slot]*podView{}, groups: map[int]bool{}, byReplica: map[slot][]*podView{}}
	var strays []*corev1.Pod
	for _, p := range pods {
		s, ok := slotOf(p)
		if !ok {
			strays = append(strays, p)
			continue
		}
		if p.DeletionTimestamp != nil {
			// Going away: the slot counts as occupied (not creatable yet) but unavailable.
			st.bySlot[s] = &podView{Pod: p, Slot: s}
			st.groups[s.Group] = true
			continue
		}
		st.bySlot[s] = &podView{
			Pod: p, Slot: s, Ready: podReady(p),
			Failed:   p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded,
			Revision: p.Labels[v1alpha1.LabelRevision],
		}
		st.groups[s.Group] = true
	}
	for _, v := range st.bySlot {
		k := v.Slot
		k.Member = 0
		st.byReplica[k] = append(st.byReplica[k], v)
	}
	for _, vs := range st.byReplica {
		sort.Slice(vs, func(i, j int) bool { return vs[i].Slot.Member < vs[j].Slot.Member })
	}
	return st, strays
}

// lostMember reports whether replica key (Member 0) of role r lost a member
// after it ran: a member slot is empty while the others, of the current
// revision and none going away, carry the mark of a replica the controller
// saw whole and Running (toMark). A replica never whole (a quota let only
// some members in, a rollout or a recovery whose old members still
// terminate) is completed by step 3 instead: judged from the pods there
// alone, it was recreated again and again. s is one of its members, for
// the recovery policy.
func (st *state) lostMember(r *v1alpha1.Role, key slot, rev string) (s slot, lost bool) {
	vs := st.byReplica[key]
	if len(vs) == 0 || len(vs) >= members(r) {
		return slot{}, false
	}
	marked := false
	for _, v := range vs {
		if v.Pod.DeletionTimestamp != nil || v.Revision != rev || v.Slot.Member >= members(r) {
			return slot{}, false
		}
		marked = marked || v.Pod.Annotations[v1alpha1.AnnotationReplicaComplete] != ""
	}
	return vs[0].Slot, marked
}

// toMark are the members of replica key to mark complete: every member of
// the current revision there, Running, none going away, and some without
// the mark.
func (st *state) toMark(r *v1alpha1.Role, key slot, rev string) []*corev1.Pod {
	vs := st.byReplica[key]
	if len(vs) != members(r) {
		return nil
	}
	var out []*corev1.Pod
	for _, v := range vs {
		if v.Pod.DeletionTimestamp != nil || v.Revision != rev || v.Pod.Status.Phase != corev1.PodRunning {
			return nil
		}
		if v.Pod.Annotations[v1alpha1.AnnotationReplicaComplete] == "" {
			out = append(out, v.Pod)
		}
	}
	return out
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func members(r *v1alpha1.Role) int {
	if r.Workers == nil {
		return 1
	}
	return 1 + int(r.Workers.Count)
}

// replicaState is one replica (leader and workers) as the plan and the
// status see it.
type replicaState struct {
	// Pods are the replica's pods, any member index, going away or not.
	Pods []*podView
	// Old: a pod not going away is at another revision than the role's,
	// or is a member beyond the role's current workers. An old replica is
	// replaced whole (rolled), never completed or trimmed member by member:
	// its pods stay of one revision.
	Old bool
	// Size is the members the replica's pods were made for: the role's at
	// the current revision, else the group size its pods carry
	// (KVMESH_GROUP_SIZE). A member slot beyond it never existed: when
	// workers.count grows, it does not make an outdated replica unavailable.
	Size int
	// Mixed: its pods are of several revisions, some of the current one
	// (as an older controller left a replica below rollout.partition that
	// lost a pod).
	Mixed bool
	// Lost: a member below Size has no pod, or its pod is going away.
	Lost bool
	// Ready: no member is lost and every one is ready.
	Ready bool
}

// replica reads replica i of role r in group g; rev is the role's
// revision, deleted the pods this step deletes.
func (st *state) replica(g int, r *v1alpha1.Role, i int, rev string, deleted map[*corev1.Pod]bool) replicaState {
	rs := replicaState{Pods: st.byReplica[slot{g, r.Name, i, 0}], Size: members(r)}
	gone := func(v *podView) bool { return deleted[v.Pod] || v.Pod.DeletionTimestamp != nil }
	oldSize, current := 0, false
	for _, v := range rs.Pods {
		if gone(v) {
			continue
		}
		if v.Revision != rev || v.Slot.Member >= rs.Size {
			rs.Old = true
		} else {
			current = true
		}
		n, _ := podGroupSize(v.Pod) // 0 if it has none: then at least its members
		oldSize = max(oldSize, n, v.Slot.Member+1)
	}
	if rs.Old {
		rs.Size, rs.Mixed = oldSize, current
	}
	rs.Ready = true
	for m := range rs.Size {
		v := st.bySlot[slot{g, r.Name, i, m}]
		if v == nil || gone(v) {
			rs.Lost = true
		}
		if v == nil || gone(v) || !v.Ready {
			rs.Ready = false
		}
	}
	return rs
}

// podGroupSize is the replica size a pod was made for (buildPod's
// KVMESH_GROUP_SIZE; the last one, as a container's environment resolves).
func podGroupSize(p *corev1.Pod) (int, bool) {
	for _, c := range p.Spec.Containers {
		v := ""
		for _, e := range c.Env {
			if e.Name == EnvGroupSize {
				v = e.Value
			}
		}
		if n, err := strconv.Atoi(v); err == nil && n >= 1 {
			return n, true
		}
	}
	return 0, false
}

// computePlan is the reconcile's decision, a pure function of the
// (defaulted) deployment and its pods.
func computePlan(md *v1alpha1.ModelDeployment, pods []*corev1.Pod) *plan {
	st, strays := newState(pods)
	p := &plan{Gang: map[int][]slot{}, Rolled: map[string]int{}}
	for _, s := range strays {
		p.Delete = append(p.Delete, deletion{s, reasonUnknown})
	}
	groups := int(*md.Spec.Groups)
	roles := map[string]*v1alpha1.Role{}
	for i := range md.Spec.Roles {
		roles[md.Spec.Roles[i].Name] = &md.Spec.Roles[i]
	}
	deleted := map[*corev1.Pod]bool{}
	del := func(v *podView, reason string) {
		if v != nil && v.Pod.DeletionTimestamp == nil && !deleted[v.Pod] {
			deleted[v.Pod] = true
			p.Delete = append(p.Delete, deletion{v.Pod, reason})
		}
	}
	// 1. Scale down: pods outside the spec. A member beyond the role's
	// workers is not: its replica is outdated (workers.count is in the
	// revision) and replaced whole by the rollout, within its budget.
	for s, v := range st.bySlot {
		r := roles[s.Role]
		if s.Group >= groups || r == nil || s.Replica >= int(*r.Replicas) {
			del(v, reasonScaleDown)
		}
	}
	// 2. Recovery of failed pods.
	p.recover(md, st, del)
	// 3. Create what is missing; new groups as gangs. An outdated replica
	// gets no pod: it is replaced whole (step 4), so that its members
	// never mix revisions and a new member slot never makes it unavailable.
	for g := range groups {
		newGroup := !st.groups[g]
		for _, r := range md.Spec.Roles {
			rev := revision(md, &r)
			for i := range int(*r.Replicas) {
				if st.replica(g, &r, i, rev, deleted).Old {
					continue
				}
				for m := range members(&r) {
					s := slot{g, r.Name, i, m}
					if st.bySlot[s] != nil {
						continue // occupied, or deleted in this step: created on a later pass
					}
					if newGroup && i < int(*r.GangMinimum) {
						p.Gang[g] = append(p.Gang[g], s)
					} else {
						p.Create = append(p.Create, s)
					}
				}
			}
		}
	}
	// 4. Rolling update within maxUnavailable per role and group.
	for g := range groups {
		if !st.groups[g] {
			continue
		}
		for i := range md.Spec.Roles {
			p.roll(md, &md.Spec.Roles[i], g, st, deleted, del)
		}
	}
	sort.Slice(p.Delete, func(i, j int) bool { return p.Delete[i].Pod.Name < p.Delete[j].Pod.Name })
	return p
}

// recover applies the recovery policy to failed pods, and to replicas that
// lost a member once running (lostMember): a multi-node engine's leader
// whose worker was deleted or evicted holds a broken process group, which a
// new worker alone cannot join (LeaderWorkerSet recreates the group too).
func (p *plan) recover(md *v1alpha1.ModelDeployment, st *state, del func(*podView, string)) {
	var failedGroups []int
	seen := map[int]bool{}
	var failed []slot
	mark := func(s slot) {
		failed = append(failed, s)
		if !seen[s.Group] {
			seen[s.Group] = true
			failedGroups = append(failedGroups, s.Group)
		}
	}
	for s, v := range st.bySlot {
		if v.Failed {
			mark(s)
		}
	}
	for g := range int(*md.Spec.Groups) {
		for ri := range md.Spec.Roles {
			r := &md.Spec.Roles[ri]
			for i := range int(*r.Replicas) {
				key, rev := slot{g, r.Name, i, 0}, revision(md, r)
				if s, ok := st.lostMember(r, key, rev); ok && md.Spec.RecoveryPolicy != v1alpha1.RecoverNone {
					mark(s) // RecoverNone: the lost member is created alone (step 3)
				}
				p.Complete = append(p.Complete, st.toMark(r, key, rev)...)
			}
		}
	}
	sort.Ints(failedGroups)
	sort.Slice(failed, func(i, j int) bool { return podName("", failed[i]) < podName("", failed[j]) })
	switch md.Spec.RecoveryPolicy {
	case v1alpha1.RecoverGroup:
		for _, g := range failedGroups {
			for s, v := range st.bySlot {
				if s.Group == g {
					del(v, reasonRecover)
				}
			}
			p.Recovered = append(p.Recovered, fmt.Sprintf("group %d", g))
		}
	case v1alpha1.RecoverNone:
		for _, s := range failed {
			del(st.bySlot[s], reasonRecover)
			p.Recovered = append(p.Recovered, "pod "+st.bySlot[s].Pod.Name)
		}
	default: // RoleRecreate: the failed replica's leader and workers
		done := map[slot]bool{}
		for _, s := range failed {
			key := slot{s.Group, s.Role, s.Replica, 0}
			if done[key] {
				continue
			}
			done[key] = true
			for o, v := range st.bySlot {
				if o.Group == s.Group && o.Role == s.Role && o.Replica == s.Replica {
					del(v, reasonRecover)
				}
			}
			p.Recovered = append(p.Recovered, fmt.Sprintf("group %d role %s/%d", s.Group, s.Role, s.Replica))
		}
	}
}

// roll deletes outdated replicas of one role in one group, whole, highest
// index first, while fewer than maxUnavailable replicas are unavailable. A
// replica is unavailable when any member it was made with is missing,
// deleted or not ready. Outdated replicas that are unavailable cost no
// budget. Below rollout.partition an outdated replica is kept, unless it
// lost a member: its old template is not kept anywhere, so it is replaced
// whole at the current revision rather than completed with a member of
// another revision (so is one whose members are of several revisions).
func (p *plan) roll(md *v1alpha1.ModelDeployment, r *v1alpha1.Role, g int, st *state, deleted map[*corev1.Pod]bool, del func(*podView, string)) {
	rev := revision(md, r)
	unavailable := 0
	var outdated []replicaState
	for i := range int(*r.Replicas) {
		rs := st.replica(g, r, i, rev, deleted)
		if !rs.Ready {
			unavailable++
		}
		if rs.Old && (i >= int(*r.Rollout.Partition) || rs.Lost || rs.Mixed) {
			outdated = append(outdated, rs)
		}
	}
	budget := int(*r.Rollout.MaxUnavailable) - unavailable
	// Unavailable outdated replicas are replaced first: they cost no budget.
	for k := len(outdated) - 1; k >= 0; k-- {
		rs := outdated[k]
		if rs.Ready {
			if budget <= 0 {
				continue
			}
			budget--
		}
		for _, v := range rs.Pods {
			del(v, reasonRollout)
		}
		p.Rolled[r.Name]++
	}
}
