//! The filesystem's label (`btrfs filesystem label`): 256 bytes of every
//! device's superblock, NUL-padded.

use super::Filesystem;
use crate::format::consts::ROOT_TREE_OBJECTID;
use crate::{Error, Result};

/// Where the label lies in a superblock, and its room (a NUL ends it).
const LABEL_AT: usize = 0x12b;
const LABEL_ROOM: usize = 256;

impl Filesystem {
    /// The filesystem's label, its bytes as they are (the kernel takes any
    /// but NUL): as the last commit (or [`Self::set_label`]) left it.
    pub fn label_bytes(&self) -> Vec<u8> {
        let room = |raw: &[u8]| {
            let b = &raw[LABEL_AT..LABEL_AT + LABEL_ROOM];
            let len = b.iter().position(|&c| c == 0).unwrap_or(b.len() - 1);
            b[..len].to_vec()
        };
        if let Some(w) = &self.writer {
            let w = w.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(raw) = w.dev_supers.values().next() {
                return room(&raw[..]);
            }
        }
        room(&self.superblock().raw[..])
    }

    /// [`Self::label_bytes`] as text (bytes that are not UTF-8 shown as
    /// U+FFFD).
    pub fn label(&self) -> String {
        String::from_utf8_lossy(&self.label_bytes()).into_owned()
    }

    /// Set the label (at most 255 bytes, no NUL) on every device and
    /// commit, as the kernel's `FS_IOC_SETFSLABEL` does.
    pub fn set_label(&self, label: &[u8]) -> Result<()> {
        if label.len() >= LABEL_ROOM || label.contains(&0) {
            return Err(Error::Invalid(format!(
                "a label is at most {} bytes with no NUL ({} given)",
                LABEL_ROOM - 1,
                label.len()
            )));
        }
        self.change("setting the label", || {
            let mut w = self.writer()?;
            // The superblock names the root tree's root block with the new
            // generation: the commit must write that block (copied as is).
            self.modify_tree(&mut w, ROOT_TREE_OBJECTID, |ed, root| ed.cow_root(root))?;
            for raw in w.dev_supers.values_mut() {
                let room = &mut raw[LABEL_AT..LABEL_AT + LABEL_ROOM];
                room.fill(0);
                room[..label.len()].copy_from_slice(label);
            }
            self.commit_locked(&mut w)
        })
    }
}
