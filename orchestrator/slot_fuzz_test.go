package orchestrator

import (
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// TestPlanDeletesMalformedSlotLabels: a pod of the deployment whose index
// labels the controller would not have written (a negative index, "01" or
// "+1" for a slot another pod holds) is deleted as an orphan; before, a
// negative group passed every scale-down check and stayed forever, and a
// second spelling of an index shadowed the slot's real pod.
func TestPlanDeletesMalformedSlotLabels(t *testing.T) {
	for _, tc := range []struct{ key, val string }{
		{v1alpha1.LabelGroup, "-1"},
		{v1alpha1.LabelReplica, "-3"},
		{v1alpha1.LabelWorker, "-1"},
		{v1alpha1.LabelReplica, "01"},
		{v1alpha1.LabelGroup, "+0"},
		{v1alpha1.LabelGroup, "-0"},
		{v1alpha1.LabelWorker, " 0"},
	} {
		md := testMD(1, v1alpha1.RecoverNone, role("d", 2, 1))
		pods := existing(md)
		odd := pods[len(pods)-1].DeepCopy()
		odd.Name, odd.UID = "m-odd", types.UID("uid-odd")
		odd.Labels[tc.key] = tc.val
		for _, order := range [][]*corev1.Pod{append(pods, odd), append([]*corev1.Pod{odd}, pods...)} {
			p := computePlan(md, order)
			del, create, gang := names(p)
			if len(del) != 1 || del[0] != "m-odd" || p.Delete[0].Reason != reasonUnknown || len(create)+len(gang) != 0 {
				t.Errorf("%s=%q: delete %v (%v), create %v %v; want m-odd deleted as %s, nothing else", tc.key, tc.val, del, p.Delete, create, gang, reasonUnknown)
			}
		}
	}
}

// FuzzSlotOf: a pod's index labels read back as a slot only when they are
// what the controller writes (strconv.Itoa of a nonnegative index), and
// then as that index; anything else is no slot (a stray).
func FuzzSlotOf(f *testing.F) {
	f.Add("0", "decode", "0", "0")
	f.Add("3", "prefill", "12", "2")
	f.Add("-1", "d", "0", "0")
	f.Add("01", "d", "+1", "0")
	f.Add("9223372036854775807", "d", "0", "0")
	f.Add("99999999999999999999", "d", "0", "0")
	f.Add("0", "", "0", "0")
	f.Add("0x1", "d", "1_0", " 1")
	f.Fuzz(func(t *testing.T, g, r, i, m string) {
		p := &corev1.Pod{}
		p.Labels = map[string]string{v1alpha1.LabelGroup: g, v1alpha1.LabelRole: r, v1alpha1.LabelReplica: i, v1alpha1.LabelWorker: m}
		s, ok := slotOf(p)
		canon := func(v string) (int, bool) {
			n, err := strconv.ParseUint(v, 10, 63)
			return int(n), err == nil && strconv.FormatUint(n, 10) == v
		}
		gn, gok := canon(g)
		in, iok := canon(i)
		mn, mok := canon(m)
		want := gok && iok && mok && r != ""
		if ok != want {
			t.Fatalf("labels %q %q %q %q: ok %v, want %v", g, r, i, m, ok, want)
		}
		if !ok {
			if s != (slot{}) {
				t.Fatalf("no slot but %+v", s)
			}
			return
		}
		if s != (slot{gn, r, in, mn}) || s.Group < 0 || s.Replica < 0 || s.Member < 0 {
			t.Fatalf("labels %q %q %q %q read as %+v", g, r, i, m, s)
		}
		// Round trip: the labels the controller writes for s are these.
		if strconv.Itoa(s.Group) != g || strconv.Itoa(s.Replica) != i || strconv.Itoa(s.Member) != m {
			t.Fatalf("slot %+v does not write back as %q %q %q", s, g, i, m)
		}
	})
}
