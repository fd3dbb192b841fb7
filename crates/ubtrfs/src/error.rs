//! The library's error type. Every error names what is wrong; none panics.

use std::path::PathBuf;

/// Result with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in ubtrfs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O error on a device.
    #[error("{path}")]
    Io {
        /// The device file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A write would go past the end of a device: a chunk of the
    /// filesystem lies beyond it (a truncated image, or the wrong device).
    #[error(
        "{path}: write of {len} bytes at offset {offset} is past the end of the device ({size} bytes); is the image truncated, or the wrong device?"
    )]
    WritePastEnd {
        /// The device file.
        path: PathBuf,
        /// Where the write starts.
        offset: u64,
        /// Bytes to write.
        len: usize,
        /// Size of the device.
        size: u64,
    },
    /// A read went past the end of a device (truncated image).
    #[error(
        "{path}: read of {len} bytes at offset {offset} is past the end of the device ({size} bytes); is the image truncated?"
    )]
    ShortRead {
        /// The device file.
        path: PathBuf,
        /// Byte offset of the read.
        offset: u64,
        /// Length of the read.
        len: usize,
        /// Size of the device.
        size: u64,
    },
    /// No valid btrfs superblock on a device.
    #[error("{path}: no valid btrfs superblock ({why})")]
    NoSuperblock {
        /// The device file.
        path: PathBuf,
        /// What was wrong with each copy.
        why: String,
    },
    /// The devices given do not form one filesystem, or one is missing.
    #[error("{0}")]
    Devices(String),
    /// On-disk metadata is inconsistent or damaged.
    #[error("corrupt metadata: {0}")]
    Corrupt(String),
    /// A tree block failed verification on every copy.
    #[error("tree block at logical {logical}: {why}")]
    BadTreeBlock {
        /// Logical address of the block.
        logical: u64,
        /// What the verification found.
        why: String,
    },
    /// File data failed its checksum on every copy.
    #[error(
        "checksum mismatch: subvolume {subvol} inode {ino} file offset {file_offset} logical {logical}: no copy is good"
    )]
    DataChecksum {
        /// Subvolume (tree) id.
        subvol: u64,
        /// Inode number.
        ino: u64,
        /// Offset in the file of the bad sector.
        file_offset: u64,
        /// Logical address of the bad sector.
        logical: u64,
    },
    /// A logical address is not mapped by any chunk.
    #[error("logical address {0} is not mapped by any chunk")]
    Unmapped(u64),
    /// A feature this version does not support.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// No such file, directory or tree item.
    #[error("not found: {0}")]
    NotFound(String),
    /// No such device in the filesystem (a device id asked for).
    #[error("no such device: {0}")]
    NoDevice(String),
    /// The operation needs a directory.
    #[error("not a directory: {0}")]
    NotDir(String),
    /// The operation does not apply to a directory.
    #[error("is a directory: {0}")]
    IsDir(String),
    /// No space left for the operation.
    #[error("no space left: {0}")]
    NoSpace(String),
    /// The filesystem is open read-only.
    #[error("read-only filesystem: {0}")]
    ReadOnly(String),
    /// The name already exists.
    #[error("already exists: {0}")]
    Exists(String),
    /// The directory is not empty.
    #[error("directory not empty: {0}")]
    NotEmpty(String),
    /// No data at or after an offset (`SEEK_DATA` past the last data).
    #[error("no data: {0}")]
    NoData(String),
    /// Invalid argument from the caller.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The operation is not permitted on this kind of inode (e.g. a hard
    /// link to a directory).
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    /// The operation would cross from one subvolume to another.
    #[error("cross-subvolume operation: {0}")]
    CrossDevice(String),
    /// An inode would get more names than the format allows.
    #[error("too many links: {0}")]
    TooManyLinks(String),
    /// A file name is longer than the format allows (255 bytes).
    #[error("name too long: {0}")]
    NameTooLong(String),
    /// What is asked for would take something from its users.
    #[error("in use: {0}")]
    Busy(String),
    /// An operation that commits failed after it had begun to change the
    /// filesystem: the running transaction may be half changed, and must
    /// not be committed (a FUSE mount stops taking changes).
    #[error(transparent)]
    AfterChange(Box<Error>),
    /// An earlier change failed half-way ([`Filesystem::aborted`]): the
    /// filesystem takes no more changes until it is opened again.
    ///
    /// [`Filesystem::aborted`]: crate::fs::Filesystem::aborted
    #[error("the filesystem takes no more changes: {0}")]
    Aborted(String),
}

impl Error {
    /// The errno a POSIX caller (the FUSE adapter) should see for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound(_) => libc::ENOENT,
            Error::NoDevice(_) => libc::ENODEV,
            Error::NotDir(_) => libc::ENOTDIR,
            Error::IsDir(_) => libc::EISDIR,
            Error::Invalid(_) => libc::EINVAL,
            Error::NoSpace(_) => libc::ENOSPC,
            Error::NoData(_) => libc::ENXIO,
            Error::ReadOnly(_) | Error::Aborted(_) => libc::EROFS,
            Error::Exists(_) => libc::EEXIST,
            Error::NotEmpty(_) => libc::ENOTEMPTY,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::NotPermitted(_) => libc::EPERM,
            Error::CrossDevice(_) => libc::EXDEV,
            Error::TooManyLinks(_) => libc::EMLINK,
            Error::NameTooLong(_) => libc::ENAMETOOLONG,
            Error::Busy(_) => libc::EBUSY,
            Error::AfterChange(inner) => inner.errno(),
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            _ => libc::EIO,
        }
    }

    pub(crate) fn corrupt(msg: impl Into<String>) -> Self {
        Error::Corrupt(msg.into())
    }

    /// This error, met after its operation began to change the
    /// filesystem (see [`Error::AfterChange`]).
    pub(crate) fn after_change(self) -> Self {
        match self {
            Error::AfterChange(_) => self,
            e => Error::AfterChange(Box::new(e)),
        }
    }

    /// The message with the errors under it (an I/O error's own message
    /// says only its device), each once.
    pub fn with_causes(&self) -> String {
        let mut msg = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            let text = c.to_string();
            if !msg.ends_with(&text) {
                msg.push_str(": ");
                msg.push_str(&text);
            }
            cause = c.source();
        }
        msg
    }

    /// Whether this error came after its operation began to change the
    /// filesystem, which may be half changed.
    pub fn is_after_change(&self) -> bool {
        matches!(self, Error::AfterChange(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error met after a change began keeps its errno and message, and
    /// is marked once however often it is passed on.
    #[test]
    fn errors_after_a_change_keep_their_errno() {
        let e = Error::NoSpace("metadata".into()).after_change();
        assert!(e.is_after_change());
        assert_eq!(e.errno(), libc::ENOSPC);
        assert_eq!(e.to_string(), "no space left: metadata");
        let twice = e.after_change();
        assert!(matches!(&twice, Error::AfterChange(inner) if !inner.is_after_change()));
        assert!(!Error::NotFound("x".into()).is_after_change());
    }
}
