//! Small helpers shared by the commands: logging setup, formatting of
//! modes, times and device numbers.

use std::io::IsTerminal;
use ubtrfs::format::items::Timespec;

/// Set up `tracing` output on stderr. `verbose` counts `-v` flags; the
/// `UBTRFS_LOG` environment variable (`error`, `warn`, `info`, `debug`,
/// `trace`) overrides it. Messages of crates that use `log` (such as `fuser`)
/// are forwarded too.
pub fn init_logging(verbose: u8) {
    use tracing::Level;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let from_env = std::env::var("UBTRFS_LOG")
        .ok()
        .and_then(|v| v.parse::<Level>().ok());
    let level = from_env.unwrap_or(match verbose {
        0 => Level::WARN,
        1 => Level::INFO,
        2 => Level::DEBUG,
        _ => Level::TRACE,
    });
    // fuser warns about an unmount that already happened (after
    // `fusermount3 -u`): keep its messages to errors unless debugging.
    let fuser_level = if verbose >= 2 { level } else { Level::ERROR };
    let targets = Targets::new()
        .with_default(level)
        .with_target("fuser", fuser_level);
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_max_level(level)
        .with_target(verbose >= 2)
        .without_time()
        .finish()
        .with(targets)
        .with(LostReplies);
    // A second initialisation (never expected) is harmless: ignore its error.
    let _ = subscriber.try_init();
}

/// Drops fuser's error about a reply the kernel no longer waits for
/// (ENOENT): the request was interrupted, or the connection ended at
/// unmount while it was being answered. Nothing is lost, so a user must not
/// see an ERROR; any other failure to send a reply still shows.
struct LostReplies;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LostReplies {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        let mut seen = LostReply {
            from_fuser: event.metadata().target().starts_with("fuser"),
            lost: false,
        };
        event.record(&mut seen);
        !(seen.from_fuser && seen.lost)
    }
}

/// What [`LostReplies`] reads of an event: where it came from (records
/// forwarded from `log` carry their target in a field) and whether its
/// message reports an ENOENT reply.
struct LostReply {
    from_fuser: bool,
    lost: bool,
}

impl tracing::field::Visit for LostReply {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "log.target" && value.starts_with("fuser") {
            self.from_fuser = true;
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let text = format!("{value:?}");
            let enoent = std::io::Error::from_raw_os_error(libc::ENOENT).to_string();
            self.lost = text.contains("Failed to send FUSE reply") && text.contains(&enoent);
        }
    }
}

/// A command's outcome that is no error to print but a status to exit
/// with (`device stats -c`: 64 when a counter is not zero, as btrfs-progs).
#[derive(Debug)]
pub struct ExitWith(pub u8);

impl std::fmt::Display for ExitWith {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}

impl std::error::Error for ExitWith {}

/// An error and its causes on one line, `outer: inner: ...`, leaving out a
/// cause whose text the message already ends with (some errors repeat
/// their source in their own text).
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if msg.ends_with(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}

/// The `ls -l` style string of a mode: type letter and nine permission
/// characters, with setuid, setgid and sticky folded in.
pub fn mode_string(mode: u32) -> String {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFCHR => 'c',
        libc::S_IFBLK => 'b',
        libc::S_IFIFO => 'p',
        libc::S_IFSOCK => 's',
        libc::S_IFREG => '-',
        _ => '?',
    };
    let mut s = String::with_capacity(10);
    s.push(kind);
    // (read bit, write bit, exec bit, special bit, letter if special+exec, letter if special only)
    let triads = [
        (0o400, 0o200, 0o100, 0o4000, 's', 'S'),
        (0o040, 0o020, 0o010, 0o2000, 's', 'S'),
        (0o004, 0o002, 0o001, 0o1000, 't', 'T'),
    ];
    for (r, w, x, special, with_x, without_x) in triads {
        s.push(if mode & r != 0 { 'r' } else { '-' });
        s.push(if mode & w != 0 { 'w' } else { '-' });
        s.push(match (mode & x != 0, mode & special != 0) {
            (true, false) => 'x',
            (false, false) => '-',
            (true, true) => with_x,
            (false, true) => without_x,
        });
    }
    s
}

/// Split a device number as btrfs stores it (the kernel's internal
/// encoding: 12-bit major above a 20-bit minor) into (major, minor).
pub fn rdev_split(rdev: u64) -> (u32, u32) {
    (((rdev >> 20) & 0xfff) as u32, (rdev & 0xf_ffff) as u32)
}

/// The device number as the FUSE protocol carries it (the kernel's
/// "new" 32-bit user encoding: minor low byte, major, then minor high bits).
pub fn rdev_to_fuse(rdev: u64) -> u32 {
    let (major, minor) = rdev_split(rdev);
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// A device number as FUSE carries it (see [`rdev_to_fuse`]) in the
/// encoding btrfs stores.
pub fn rdev_from_fuse(rdev: u32) -> u64 {
    let major = (rdev >> 8) & 0xfff;
    let minor = (rdev & 0xff) | ((rdev >> 12) & 0xfff00);
    (u64::from(major) << 20) | u64::from(minor)
}

/// The device number as the host's `mknod` wants it.
pub fn rdev_to_host(rdev: u64) -> libc::dev_t {
    let (major, minor) = rdev_split(rdev);
    libc::makedev(major, minor)
}

/// A UTC calendar date and time from seconds since the Unix epoch, as
/// `YYYY-MM-DD HH:MM`.
pub fn format_time(t: &Timespec) -> String {
    let days = t.sec.div_euclid(86_400);
    let secs = t.sec.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        secs / 3600,
        secs / 60 % 60
    )
}

/// (year, month, day) of the proleptic Gregorian calendar for a count of days
/// since 1970-01-01. Works in 400-year eras of 146097 days, with years that
/// start on March 1 so that the leap day falls at the end of a year.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Shift the epoch to 0000-03-01.
    let z = days.saturating_add(719_468);
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097); // 0 ..= 146096
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153; // 0 = March .. 11 = February
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    } as u32;
    let year = year_of_era + era.saturating_mul(400) + i64::from(month <= 2);
    (year, month, day)
}

/// A name or path from the filesystem, for messages (lossy UTF-8).
pub fn show(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    /// Collects what the formatter writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn replies_the_kernel_forgot_are_not_reported() {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .without_time()
            .finish()
            .with(LostReplies);
        tracing::subscriber::with_default(subscriber, || {
            let enoent = std::io::Error::from_raw_os_error(libc::ENOENT);
            let einval = std::io::Error::from_raw_os_error(libc::EINVAL);
            tracing::error!(target: "fuser::reply", "Failed to send FUSE reply: {enoent}");
            tracing::error!(target: "fuser::reply", "Failed to send FUSE reply: {einval}");
            tracing::error!("Failed to send FUSE reply: {enoent}");
            // fuser logs through `log`; the mount forwards those records.
            let _ = tracing_log::LogTracer::init();
            log::error!(target: "fuser::reply", "Failed to send FUSE reply: {enoent}");
            log::error!(target: "fuser::reply", "Failed to send FUSE reply: {einval}");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].contains("Invalid argument"), "{text}");
        assert!(lines[1].contains("No such file"), "not fuser's: {text}");
        assert!(lines[2].contains("Invalid argument"), "{text}");
    }

    #[test]
    fn modes() {
        assert_eq!(mode_string(0o100644), "-rw-r--r--");
        assert_eq!(mode_string(0o040755), "drwxr-xr-x");
        assert_eq!(mode_string(0o104755), "-rwsr-xr-x");
        assert_eq!(mode_string(0o041777), "drwxrwxrwt");
        assert_eq!(mode_string(0o102644), "-rw-r-Sr--");
        assert_eq!(mode_string(0o120777), "lrwxrwxrwx");
    }

    #[test]
    fn dates() {
        let t = |sec| format_time(&Timespec { sec, nsec: 0 });
        assert_eq!(t(0), "1970-01-01 00:00");
        assert_eq!(t(951_782_400), "2000-02-29 00:00");
        assert_eq!(t(1_700_000_000), "2023-11-14 22:13");
        assert_eq!(t(-1), "1969-12-31 23:59");
        assert_eq!(t(4_102_444_800), "2100-01-01 00:00");
        // Extremes must not panic.
        let _ = t(i64::MAX);
        let _ = t(i64::MIN);
    }

    #[test]
    fn device_numbers() {
        // The kernel stores makedev(1, 3) as 1 << 20 | 3.
        assert_eq!(rdev_split(1_048_579), (1, 3));
        assert_eq!(rdev_split(314_642_800), (300, 70_000));
        assert_eq!(rdev_to_fuse(1_048_579), 0x103);
        let (ma, mi) = rdev_split(314_642_800);
        let enc = rdev_to_fuse(314_642_800);
        assert_eq!((enc >> 8) & 0xfff, ma);
        assert_eq!((enc & 0xff) | ((enc >> 12) & !0xff), mi);
        for rdev in [0, 1_048_579, 314_642_800, (0xfff << 20) | 0xf_ffff] {
            assert_eq!(rdev_from_fuse(rdev_to_fuse(rdev)), rdev);
        }
        // What the kernel sends for makedev(8, 1).
        assert_eq!(rdev_from_fuse(0x801), 8 << 20 | 1);
    }
}
