// Package autoscale decides per-role replica counts for an
// AutoscalingPolicy. It is pure: no clock, no API calls, no metrics client;
// the caller passes the time and the observations (read from the mesh's
// gossip or a Prometheus query) and applies the result to RoleScalers.
//
//   - Recommend: HPA's rule (ceil(current × value/target), or ceil(total /
//     per-replica target) for counts; the maximum over metrics) with a
//     tolerance band.
//   - Autoscaler.Step: KPA-style stable and panic windows over those
//     recommendations, scale-up/down rate limits, a scale-down cool-down
//     after any scale-up, min/max per role. StepWithin also keeps the
//     target's pods within a budget (a ModelDeployment's MaxPods).
//     Replica counts saturate: a demand or rate beyond int32 means max.
//   - RepairRatio: keeps numerator/denominator replicas within a band,
//     raising the lagging role first and lowering the other only when the
//     lagging one is at its max (Kthena's scale-up-biased repair); a role at
//     zero beside a non-zero one is seeded to one.
//   - SizeSLO: sizes prefill from prompt tokens/s over per-replica prefill
//     throughput and decode from running streams over streams per replica,
//     each corrected by measured/expected latency (Dynamo's planner).
package autoscale
