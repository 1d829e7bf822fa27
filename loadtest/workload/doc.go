// Package workload generates and reads benchmark workloads as a list of
// requests with arrival times, deterministic prompt token ids, output
// lengths and a group/session id: synthetic shared-prefix workloads
// (G groups × P prompts, S shared + Q question tokens, O output tokens) and
// Mooncake-format traces (hash_ids of 512-token blocks). The discrete-event
// benchmark, the load generator and the demo all replay the same requests.
//
// Token ids are a pure function of (seed, block identity, position), so the
// same prefix always produces the same tokens — and the same kvmesh keys —
// in every run and every process. Prompts are generated on demand
// (Request.AppendPrompt) so an hour-long trace does not hold gigabytes of
// tokens. The package must not know about engines, HTTP or scheduling.
package workload
