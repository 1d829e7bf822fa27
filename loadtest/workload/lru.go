package workload

import "container/list"

// LRUHitRate is the prefix hit rate, in tokens, of ONE LRU cache of
// capacityBlocks blocks of blockSize tokens (the whole cluster's
// capacity) replaying the requests in arrival order: the bound a router in
// front of LRU engines can expect at best (loadtest/analysis/lrubound.py
// does the same on a Mooncake trace's 512-token hash ids, counting blocks,
// not tokens: a coarser and lower bound). A request's
// blocks are looked up as a prefix, as vLLM does: after the first miss the
// rest of the prompt is computed and inserted. Only full blocks hit.
func LRUHitRate(reqs []Request, blockSize, capacityBlocks int) float64 {
	if blockSize <= 0 || capacityBlocks <= 0 {
		return 0
	}
	order := list.New()
	pos := make(map[uint64]*list.Element)
	var hit, total int
	var buf []uint32
	for i := range reqs {
		buf = reqs[i].AppendPrompt(buf[:0])
		total += len(buf)
		h := uint64(0x9E3779B97F4A7C15)
		miss := false
		for b := 0; (b+1)*blockSize <= len(buf); b++ {
			for _, t := range buf[b*blockSize : (b+1)*blockSize] {
				h = (h ^ uint64(t)) * 0x100000001B3
			}
			if e, ok := pos[h]; ok {
				if !miss {
					hit += blockSize
				}
				order.MoveToBack(e)
				continue
			}
			miss = true
			pos[h] = order.PushBack(h)
			if order.Len() > capacityBlocks {
				old := order.Front()
				delete(pos, old.Value.(uint64))
				order.Remove(old)
			}
		}
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}
