//! CacheIndexerKeys: DeepSeek-V3.2's indexer keys into their paged cache by slot.

use vt_core::{CacheIndexerKeysArgs, OpId, Queue, Result};

use crate::host::HostView;

const OP: OpId = OpId::CacheIndexerKeys;

pub(crate) fn run(_q: &Queue, a: &CacheIndexerKeysArgs<'_>) -> Result<()> {
    let k = HostView::new(OP, &a.k)?;
    let cache = HostView::new(OP, &a.cache)?;
    let slots = HostView::new(OP, &a.slot_mapping)?;
    let (t, di, bs) = (k.dim(0), k.dim(1), cache.dim(1) as i64);
    let total = cache.dim(0) as i64 * bs;
    let mut row = vec![0f32; di];
    for ti in 0..t {
        let s = slots.get_int(&[ti]);
        // Padding (< 0) is skipped; past the cache is rejected by validation on the CPU.
        if s < 0 || s >= total {
            continue;
        }
        k.read_row(&[ti], &mut row);
        cache.write_row(&[(s / bs) as usize, (s % bs) as usize], &row);
    }
    Ok(())
}
