//! Read repair: a copy of a data sector or tree block that a read found
//! bad, while another copy was good, is written over with the good one,
//! as the kernel's reads mend what they find in a writable filesystem.
//! Data is mended at once by the read (when the transaction is free);
//! tree blocks by the next commit, under the transaction.

use super::Filesystem;
use crate::csum_tree;
use crate::format::node::Node;
use crate::transaction::Writer;

/// A data sector a read found bad in `mirrors` and good in another copy.
pub(crate) struct BadDataCopies {
    pub logical: u64,
    pub mirrors: Vec<usize>,
    pub good: Vec<u8>,
    pub sum: [u8; 32],
}

impl Filesystem {
    /// Write the good copy read over the bad ones, as the kernel mends
    /// what a read found ("read error corrected"): only when writable and
    /// the transaction is free at once (a read never waits for it, nor
    /// could it when its caller holds it), only in mirrored chunks (in
    /// RAID5/6 a copy is not written alone), and only while
    /// the checksum tree, under the transaction, still holds the sum the
    /// good copy matched: the extent is still allocated, so nothing else
    /// writes there. A copy that stays bad is left to a scrub.
    pub(crate) fn mend_read_copies(&self, found: &[BadDataCopies]) {
        if found.is_empty() {
            return;
        }
        let Some(writer) = self.writer.as_ref() else {
            return;
        };
        let Ok(_held) = writer.try_lock() else {
            return;
        };
        if self.check_not_aborted().is_err() {
            return;
        }
        let volume = self.trees.volume();
        let Ok(Some(tree)) = self.csum_tree() else {
            return;
        };
        for f in found {
            if !volume.copy_writable_alone(f.logical) {
                continue;
            }
            let still =
                csum_tree::lookup(&tree, f.logical, 1, self.geo.sectorsize, self.geo.csum_size);
            if !matches!(still.as_deref(), Ok([Some(s)]) if *s == f.sum) {
                continue;
            }
            for &mirror in &f.mirrors {
                match volume.write_copy(f.logical, mirror, &f.good) {
                    Ok(()) => {
                        volume.copy_mended(f.logical, mirror);
                        tracing::info!(
                            "read error corrected: data sector {} copy {mirror}",
                            f.logical
                        )
                    }
                    Err(e) => {
                        tracing::warn!("mending data sector {} copy {mirror}: {e}", f.logical)
                    }
                }
            }
        }
    }

    /// Write the good copy of each tree block a read found bad copies of
    /// over them (called by the commit, under the transaction `_w`). The
    /// good copy is read and verified against the pointer that led to it
    /// again: a block rewritten at that address since (by a commit) no
    /// longer verifies and is left alone.
    pub(crate) fn mend_tree_copies(&self, _w: &mut Writer) {
        let reader = self.tree_reader();
        let found = reader.take_bad_copies();
        let volume = reader.volume();
        let generation = self.committed.load(std::sync::atomic::Ordering::Acquire);
        for f in found {
            let at = f.expect.bytenr;
            if !volume.copy_writable_alone(at) || reader.is_dirty(at) {
                continue;
            }
            let Ok(copies) = volume.num_copies(at) else {
                continue;
            };
            // The copy `mirror` as read, if it verifies.
            let verified = |mirror: usize| {
                let mut buf = vec![0u8; reader.nodesize()];
                volume.read_copy(at, mirror, &mut buf).ok()?;
                Node::parse(
                    buf.clone().into_boxed_slice(),
                    reader.csum_type(),
                    reader.fsids(),
                    &f.expect,
                    generation,
                )
                .ok()?;
                Some(buf)
            };
            let Some(good) = (0..copies)
                .filter(|m| !f.mirrors.contains(m))
                .find_map(verified)
            else {
                continue;
            };
            for &mirror in &f.mirrors {
                // Mended since (by a scrub), or not bad for good.
                if verified(mirror).is_some() {
                    continue;
                }
                match volume.write_copy(at, mirror, &good) {
                    Ok(()) => tracing::info!("read error corrected: tree block {at} copy {mirror}"),
                    Err(e) => tracing::warn!("mending tree block {at} copy {mirror}: {e}"),
                }
            }
        }
    }
}
