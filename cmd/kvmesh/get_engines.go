package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/scheduler/learn"
)

// engineResource reports whether a get/describe command line names the
// engines resource: its first positional argument (flags skipped, with the
// value of those that take one) is engines, engine or eng.
func engineResource(args []string) bool {
	valued := map[string]bool{"kubeconfig": true, "namespace": true, "join": true, "gossip-key": true, "wait": true, "gossip-bind": true, "gossip-advertise": true}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if name, ok := strings.CutPrefix(strings.TrimPrefix(a, "-"), "-"); ok || strings.HasPrefix(a, "-") {
			if !ok {
				name = strings.TrimPrefix(a, "-")
			}
			if !strings.Contains(name, "=") && valued[name] {
				i++
			}
			continue
		}
		return a == "engines" || a == "engine" || a == "eng"
	}
	return false
}

// runEngines is `kvmesh get engines [NAME]` and `kvmesh describe engine
// NAME`: it joins the mesh's gossip as an observer (role orchestrator, as
// the ingress and the orchestrator do), waits until the engines it learns
// stop changing, prints them and leaves. Gossip is what every engine's
// sidecar publishes, so the view needs no ingress and no Kubernetes.
func runEngines(ctx context.Context, verb string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(verb+" engines", stderr)
	var probs flagProblems
	var seeds []string
	List(fs, &seeds, "join", "gossip seeds host:port, comma-separated (a sidecar, an ingress or kvmesh orchestrator --local's gossip address; env KVMESH_GOSSIP_SEEDS)")
	var key []byte
	var extra [][]byte
	gossipKeyFlag(fs, &key, &extra, &probs)
	bind := fs.String("gossip-bind", "", "where this observer listens, IP:port (IPv6 in brackets; must be reachable by the members; default: a free port on this host's address that reaches the first --join seed, [::1]:0 for a seed on [::1], 127.0.0.1:0 when none is reached)")
	advertise := fs.String("gossip-advertise", "", "the IP, or IP:port (IPv6 in brackets), the members dial, when it differs from the bind address")
	wait := fs.Duration("wait", 3*time.Second, "how long to wait for the view to settle (0: what joining brought, without waiting)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: kvmesh %s engine%s --join HOST:PORT[,...] [--gossip-key KEY]\n", verb, map[string]string{"get": "s [NAME]", "describe": " NAME"}[verb])
		fs.PrintDefaults()
	}
	var pos []string
	for len(args) > 0 {
		if err := parseFlags(fs, args, 100); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	if *wait < 0 {
		probs.add("--wait %v: want ≥ 0", *wait)
	}
	if err := probs.err(); err != nil {
		return err
	}
	if len(seeds) == 0 {
		seeds = commaList(os.Getenv("KVMESH_GOSSIP_SEEDS"))
	}
	if len(pos) > 2 || (verb == "describe" && len(pos) != 2) || len(seeds) == 0 {
		fs.Usage()
		return fmt.Errorf("%w: want --join and %s", errUsage, map[string]string{"get": "an optional engine name", "describe": "an engine name"}[verb])
	}
	for _, s := range seeds {
		// memberlist dials a seed without a port at this observer's own
		// port: it would join itself and print an empty table.
		if _, _, err := net.SplitHostPort(s); err != nil {
			return fmt.Errorf("%w: --join %q: want host:port, IPv6 in brackets ([fd00::1]:7946): a seed without a port is dialled at this observer's own", errUsage, s)
		}
	}
	name := ""
	if len(pos) == 2 {
		name = pos[1]
	}
	if *bind == "" {
		*bind = observerBind(seeds)
	}
	node, err := observeMesh(*bind, *advertise, seeds, key, extra)
	if err != nil {
		return err
	}
	defer node.Close()
	engines := settle(ctx, node, *wait)
	members := node.Members()
	dups := node.Duplicates()
	lr, _ := learn.FromShares(node.AppStates(learn.StateName)) // the ingresses' learned costs
	if name != "" {
		i := slices.IndexFunc(engines, func(e gossip.EngineView) bool { return e.ID == name })
		if i < 0 {
			return fmt.Errorf("engine %q not in the mesh (%d engines seen)", name, len(engines))
		}
		engines = engines[i : i+1]
	}
	if verb == "describe" {
		return describeEngine(stdout, engines[0], members, dups, lr, time.Now())
	}
	if err := writeEngines(stdout, engines, dups, lr, time.Now()); err != nil {
		return err
	}
	writeDuplicates(stderr, engines, dups)
	return nil
}

// nodes are the members gossiping e: the one whose state is shown first,
// then any other (two sidecars for one engine), sorted.
func nodes(e gossip.EngineView, dups gossip.Duplicates) []string {
	out := []string{e.Node}
	for _, n := range dups.Engines[e.ID] {
		if n != e.Node {
			out = append(out, n)
		}
	}
	return out
}

// sharedURL is the other engine ids gossiped with e's URL (nil: none).
func sharedURL(e gossip.EngineView, dups gossip.Duplicates) []string {
	var out []string
	for _, id := range dups.URLs[gossip.NormalURL(e.URL)] {
		if id != e.ID {
			out = append(out, id)
		}
	}
	return out
}

// writeDuplicates warns, below the table, of the listed engines that two
// sidecars gossip (two engines, when their URLs differ) and of the URLs
// several of them share (docs/OPERATIONS.md,
// "A second sidecar on one engine").
func writeDuplicates(w io.Writer, es []gossip.EngineView, dups gossip.Duplicates) {
	urls := map[string]bool{}
	for _, e := range es {
		switch ns := nodes(e, dups); {
		case len(dups.Conflicts[e.ID]) > 1:
			fmt.Fprintf(w, "error: engine id %s is gossiped by %d sidecars (%s) with different URLs (%s): two engines share one id; give each its own --engine-id\n",
				e.ID, len(ns), strings.Join(ns, ", "), strings.Join(dups.Conflicts[e.ID], ", "))
		case len(ns) > 1:
			fmt.Fprintf(w, "warning: engine %s is gossiped by %d sidecars (%s): two sidecars for one engine\n", e.ID, len(ns), strings.Join(ns, ", "))
		}
		u := gossip.NormalURL(e.URL)
		if ids := dups.URLs[u]; len(ids) > 1 && !urls[u] {
			urls[u] = true
			fmt.Fprintf(w, "warning: engines %s share the URL %s: different --engine-id for one engine, routed to as %d engines\n", strings.Join(ids, ", "), u, len(ids))
		}
	}
}

// observeMesh joins the gossip at seeds as an observer. bind and advertise
// are read by gossip.Config.SetAddrs, as every member's are (IPv6 too).
func observeMesh(bind, advertise string, seeds []string, key []byte, extra [][]byte) (*gossip.Node, error) {
	g := gossip.DefaultConfig()
	if err := g.SetAddrs(bind, advertise); err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	hn, _ := os.Hostname()
	// Unique per call: a member of the same name that left moments ago may
	// still be alive to the seed, which would refuse this one.
	g.Name = fmt.Sprintf("kvmesh-get-%s-%d-%08x", hn, os.Getpid(), rand.Uint32())
	g.Join, g.SecretKey, g.ExtraKeys = seeds, key, extra
	g.Meta = gossip.NodeMeta{Role: gossip.RoleOrchestrator, ID: g.Name}
	g.Logger = discardLogger()
	node, err := gossip.New(g)
	if err != nil {
		return nil, fmt.Errorf("join the mesh: %w", err)
	}
	if node.NumMembers() <= 1 {
		if _, err := node.Join(seeds); err != nil {
			node.Shutdown()
			return nil, fmt.Errorf("join the mesh at %v: %w", seeds, err)
		}
	}
	if node.NumMembers() <= 1 { // the seeds answered as this observer (its own address given)
		addr := node.Addr()
		node.Shutdown()
		return nil, fmt.Errorf("join the mesh at %v: the seeds reached only this observer (listening at %s), no member of the mesh", seeds, addr)
	}
	return node, nil
}

// observerBind is the observer's default --gossip-bind: a free port on the
// address of this host that the first seed reachable is routed from, in
// the seeds' address family, so the members' probes and gossip reach it
// (bound to 127.0.0.1, every member of an IPv6 mesh logged "network is
// unreachable" for it). Connecting a UDP socket only picks the route and
// sends nothing. 127.0.0.1:0 when no seed resolves.
func observerBind(seeds []string) string {
	d := net.Dialer{Timeout: 5 * time.Second}
	for _, s := range seeds {
		c, err := d.Dial("udp", s)
		if err != nil {
			continue
		}
		a, ok := c.LocalAddr().(*net.UDPAddr)
		_ = c.Close()
		if ok && a.Zone == "" { // memberlist binds no link-local zone
			return net.JoinHostPort(a.IP.String(), "0")
		}
	}
	return "127.0.0.1:0"
}

// settle polls the view until every sidecar member gossips at least one
// engine and two polls 300 ms apart agree on the engines, or wait passes.
// A join's push/pull brings the seed's state at once, but the seed may not
// have heard every other sidecar's engines yet; the member list, which the
// push/pull brings whole, says whose are still missing.
func settle(ctx context.Context, n *gossip.Node, wait time.Duration) []gossip.EngineView {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	ids := func(es []gossip.EngineView) string {
		var b strings.Builder
		for _, e := range es {
			b.WriteString(e.ID)
			b.WriteByte(0)
		}
		return b.String()
	}
	last := n.Engines()
	for {
		select {
		case <-ctx.Done():
			return last
		case <-deadline.C:
			return n.Engines()
		case <-tick.C:
		}
		cur := n.Engines()
		if len(cur) > 0 && ids(cur) == ids(last) && everySidecarSeen(n.Members(), cur, n.Duplicates()) {
			return cur
		}
		last = cur
	}
}

// everySidecarSeen: each live sidecar member gossips at least one engine
// (dups names the second sidecar of an engine, whose state es may not show).
func everySidecarSeen(members map[string]gossip.NodeMeta, es []gossip.EngineView, dups gossip.Duplicates) bool {
	from := make(map[string]bool, len(es))
	for _, e := range es {
		for _, n := range nodes(e, dups) {
			from[n] = true
		}
	}
	for name, m := range members {
		if m.Role == gossip.RoleSidecar && !from[name] {
			return false
		}
	}
	return true
}

// blocks is an engine's index size: its cached blocks over every tier.
func blocks(e gossip.EngineView) uint64 {
	var n uint64
	for t := range kvevents.NumTiers {
		n += e.Digest.Digests[t].Count
	}
	return n
}

// group is the engine's P/D group ("-": none, every engine pairs with every other).
func group(e gossip.EngineView) string {
	if e.Group == "" {
		return "-"
	}
	return e.Group
}

func role(e gossip.EngineView) string {
	if e.EngineRole == "" {
		return "mixed"
	}
	return e.EngineRole
}

// writeEngines prints the table. NODES are the members gossiping the
// engine, the one whose state is shown first (more than one: two sidecars
// for one engine). AGE is the age of the engine's gossiped state (engineAge):
// a sidecar publishes a change within 250 ms, so a large AGE is an idle
// engine or a sidecar that stopped publishing. PREFILL TOK/S is the prefill rate the ingresses have learned
// for the engine ("-": none has measured it).
func writeEngines(w io.Writer, es []gossip.EngineView, dups gossip.Duplicates, lr *learn.Learner, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tMODEL\tROLE\tGROUP\tREADY\tRUNNING\tWAITING\tKV%\tBLOCKS\tNODES\tAGE\tPREFILL TOK/S")
	for _, e := range es {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%d\t%d\t%.0f\t%d\t%s\t%s\t%s\n", e.ID, e.Model, role(e), group(e), e.Ready, e.Running, e.Waiting,
			100*e.KVUsage, blocks(e), strings.Join(nodes(e, dups), ","), engineAge(e, now), learnedPrefill(lr, e.ID))
	}
	return tw.Flush()
}

// learnedPrefill is engine id's learned prefill rate, "-" when no ingress
// has measured it.
func learnedPrefill(lr *learn.Learner, id string) string {
	if !lr.Measured(id) {
		return "-"
	}
	return fmt.Sprintf("%.0f", lr.Rates(id).PrefillRate)
}

// engineAge is how old e's state is. Gossip tells it without comparing
// clocks (EngineView.Age); from a sidecar that predates that, it is the time
// since e.Updated, the sidecar's wall clock, read on this host's: off by the
// skew between the two (one ahead showed 0s, one behind minutes), so "?"
// when the state claims to come from more than a second in this host's
// future.
func engineAge(e gossip.EngineView, now time.Time) string {
	if e.Age >= 0 {
		return age(e.Age)
	}
	d := now.Sub(e.Updated)
	if d < -maxAgeSkew {
		return "?"
	}
	return age(d)
}

// maxAgeSkew is how far in this host's future a sidecar's clock may date a
// state before engineAge says it cannot tell its age (NTP keeps hosts within
// milliseconds; a state is ordinarily dated before it arrives).
const maxAgeSkew = time.Second

func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0.0s"
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	default:
		return d.Truncate(time.Second).String()
	}
}

func describeEngine(w io.Writer, e gossip.EngineView, members map[string]gossip.NodeMeta, dups gossip.Duplicates, lr *learn.Learner, now time.Time) error {
	var b strings.Builder
	field := func(k string, v any) { fmt.Fprintf(&b, "%-16s %v\n", k+":", v) }
	field("Name", e.ID)
	field("Model", e.Model)
	field("Role", role(e))
	field("P/D group", group(e))
	if e.PDProtocol != "" {
		field("P/D protocol", e.PDProtocol)
	}
	field("URL", natsutil.RedactURL(e.URL)) // its userinfo, if any, is a secret (docs/SECURITY.md)
	if ids := sharedURL(e, dups); len(ids) > 0 {
		field("URL shared by", strings.Join(ids, ", ")+" (different --engine-id for this engine: routed to as one engine each)")
	}
	field("Ready", e.Ready)
	field("Running", e.Running)
	field("Waiting", e.Waiting)
	field("KV usage", fmt.Sprintf("%.1f%%", 100*e.KVUsage))
	field("Queued prefill", fmt.Sprintf("%d tokens", e.QueuedPrefill))
	field("Block size", e.BlockSize)
	if e.DPSize > 1 {
		field("DP size", e.DPSize)
	}
	if e.LoRAs != "" {
		field("LoRA adapters", strings.ReplaceAll(e.LoRAs, ",", ", "))
	}
	field("Node", e.Node)
	if m, ok := members[e.Node]; ok {
		field("Node role", m.Role)
	}
	if ns := nodes(e, dups); len(ns) > 1 {
		field("Other nodes", strings.Join(ns[1:], ", ")+" (two sidecars for one engine)")
	}
	if a := engineAge(e, now); a == "?" {
		field("Updated", "unknown (the sidecar dates it in this host's future: its clock is ahead)")
	} else {
		field("Updated", a+" ago")
	}
	// Decimal, as every other tool prints epochs and digests (/debug/state,
	// /debug/index, kvmesh inspect stream): one compares with another as is.
	field("Delta head", fmt.Sprintf("epoch %d seq %d", e.Digest.Head.Epoch, e.Digest.Head.Seq))
	if lr.Measured(e.ID) {
		r := lr.Rates(e.ID)
		field("Learned costs", fmt.Sprintf("prefill %.0f tokens/s, decode step %.1f ms + %.3g s per context token (ingresses sharing: %d)",
			r.PrefillRate, 1000*r.StepBase, r.DecodeSecPerToken, lr.Peers()))
	} else {
		field("Learned costs", "none yet (no ingress has measured this engine)")
	}
	b.WriteString("Index:\n")
	for t := range kvevents.NumTiers {
		d := e.Digest.Digests[t]
		fmt.Fprintf(&b, "  %-6s %d blocks (digest sum %d xor %d)\n", kvevents.Tier(t).String(), d.Count, d.Sum, d.Xor)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
