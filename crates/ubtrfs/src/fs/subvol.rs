//! Subvolumes and snapshots.
