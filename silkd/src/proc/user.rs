//! Who a command runs as: user names and uids resolved from the guest's own `/etc/passwd`
//! and `/etc/group` (never NSS or the host's: the files are the template's), and the
//! defaults a template gives every command (`--user`, `--workdir`, `--env`).

use std::sync::OnceLock;

use crate::{Error, Result};

/// Where accounts come from; the sandbox's root is silkd's root.
const PASSWD: &str = "/etc/passwd";
const GROUP: &str = "/etc/group";
/// Larger account files are refused rather than read: a template has a handful of users.
const MAX_ACCOUNT_FILE: u64 = 4 << 20;
/// Most supplementary groups set for one command (the kernel's `NGROUPS_MAX` is 65536;
/// a template's user is in a few).
const MAX_GROUPS: usize = 256;

/// One resolved account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    /// Login shell (`/bin/sh` when the entry leaves it empty); `SHELL` for commands and
    /// what `sbx shell` starts.
    pub shell: String,
    /// Supplementary groups (the primary gid first), as `initgroups` would set them.
    pub groups: Vec<u32>,
}

/// What a template gives every command unless the request says otherwise.
#[derive(Debug, Clone, Default)]
pub struct Defaults {
    /// The user commands run as (`--user`); silkd's own when absent.
    pub user: Option<String>,
    /// The working directory (`--workdir`); silkd's own when absent.
    pub workdir: Option<String>,
    /// Environment set for every command, before the request's (`--env K=V`).
    pub env: Vec<(String, String)>,
}

static DEFAULTS: OnceLock<Defaults> = OnceLock::new();

/// Sets the defaults once, at start.
pub fn set_defaults(d: Defaults) {
    let _ = DEFAULTS.set(d);
}

/// The defaults in force (empty when never set, as in silkd's own tests).
pub fn defaults() -> &'static Defaults {
    DEFAULTS.get_or_init(Defaults::default)
}

/// Parses `--env K=V`.
pub fn parse_env_flag(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !k.contains('\0') && !v.contains('\0') => {
            Ok((k.to_string(), v.to_string()))
        }
        _ => Err(format!("--env wants KEY=VALUE without NUL, got {s:?}")),
    }
}

/// Whether silkd may change uid and gid: root with CAP_SETUID and CAP_SETGID in effect.
/// Root of a user namespace without those capabilities (the process engine without a
/// uid block, under a sandboxd that is not root) is uid 0 but may not. Read once from /proc; unreadable means try and see.
pub fn can_switch() -> bool {
    static CAN: OnceLock<bool> = OnceLock::new();
    *CAN.get_or_init(|| {
        let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
            return true;
        };
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
        // CAP_SETGID is 6, CAP_SETUID 7 (linux/capability.h).
        let wanted = (1u64 << 6) | (1u64 << 7);
        eff.is_none_or(|e| e & wanted == wanted)
    })
}

/// Who a request runs as, and whether silkd must switch to become them.
#[derive(Debug)]
pub struct Runner {
    /// The account (the request's user, else `--user`, else silkd's own when it has a
    /// passwd entry).
    pub account: Option<Account>,
    /// The account to become; `None` stays silkd's own.
    pub switch: Option<Account>,
}

/// Applies the user rules shared by exec and the file verbs: the request's user, else
/// `--user`, else silkd's own. A silkd that is not root (or lacks CAP_SETUID/CAP_SETGID)
/// acts only as itself: any other user is `bad_request` (it has no right to switch,
/// e.g. the process engine's single-uid sandbox).
pub fn runner(requested: Option<&str>) -> Result<Runner> {
    let account = match requested.or(defaults().user.as_deref()) {
        Some(who) => Some(lookup(who)?),
        None => own_account(),
    };
    // SAFETY: geteuid/getegid have no failure mode and no side effect.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let switch = match &account {
        Some(a) if a.uid == euid && a.gid == egid => None,
        Some(a) if euid != 0 || !can_switch() => {
            return Err(Error::BadRequest(format!(
                "cannot run as {:?} (uid {}): silkd runs as uid {euid} without the right to \
                 switch users (e.g. the process engine under a sandboxd that is not root), \
                 and can only act as itself",
                a.name, a.uid
            )))
        }
        Some(a) => Some(a.clone()),
        None => None,
    };
    Ok(Runner { account, switch })
}

/// Resolves `who` (a name, or a decimal uid) from the guest's account files.
pub fn lookup(who: &str) -> Result<Account> {
    let passwd = read_account_file(PASSWD)?;
    // A guest without /etc/group still runs commands, with the primary group only.
    let group = read_account_file(GROUP).unwrap_or_default();
    resolve(who, &passwd, &group)
}

/// The account silkd itself runs as, when its passwd entry exists.
pub fn own_account() -> Option<Account> {
    // SAFETY: geteuid has no failure mode and no side effect.
    let uid = unsafe { libc::geteuid() };
    lookup(&uid.to_string()).ok()
}

fn read_account_file(path: &str) -> Result<String> {
    use std::io::Read;
    let f = std::fs::File::open(path)
        .map_err(|e| Error::BadRequest(format!("cannot read {path} to resolve users: {e}")))?;
    let mut text = String::new();
    f.take(MAX_ACCOUNT_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| Error::BadRequest(format!("cannot read {path}: {e}")))?;
    if text.len() as u64 > MAX_ACCOUNT_FILE {
        return Err(Error::BadRequest(format!(
            "{path} is over {MAX_ACCOUNT_FILE} bytes"
        )));
    }
    Ok(text)
}

/// Resolves `who` against the text of a passwd and a group file. A decimal `who` is a
/// uid (it must have an entry: HOME and the groups come from it); otherwise a name.
/// Malformed lines are skipped, as libc's files backend does.
pub fn resolve(who: &str, passwd: &str, group: &str) -> Result<Account> {
    if who.is_empty() || who.contains(['\0', ':', '\n']) {
        return Err(Error::BadRequest(format!("invalid user {who:?}")));
    }
    let by_uid = who.parse::<u32>().ok();
    let entry = passwd
        .lines()
        .filter_map(parse_passwd_line)
        .find(|e| match by_uid {
            Some(uid) => e.uid == uid,
            None => e.name == who,
        })
        .ok_or_else(|| Error::BadRequest(format!("unknown user {who:?} (not in {PASSWD})")))?;
    let mut groups = vec![entry.gid];
    for line in group.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() != 4 {
            continue;
        }
        let Ok(gid) = f[2].parse::<u32>() else {
            continue;
        };
        if f[3].split(',').any(|m| m == entry.name) && !groups.contains(&gid) {
            groups.push(gid);
            if groups.len() == MAX_GROUPS {
                break;
            }
        }
    }
    Ok(Account {
        name: entry.name.to_string(),
        uid: entry.uid,
        gid: entry.gid,
        home: if entry.home.is_empty() {
            "/".into()
        } else {
            entry.home.to_string()
        },
        shell: if entry.shell.is_empty() {
            "/bin/sh".into()
        } else {
            entry.shell.to_string()
        },
        groups,
    })
}

struct PwEntry<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    home: &'a str,
    shell: &'a str,
}

fn parse_passwd_line(line: &str) -> Option<PwEntry<'_>> {
    let f: Vec<&str> = line.split(':').collect();
    if f.len() != 7 || f[0].is_empty() || f[0].starts_with(['+', '-', '#']) {
        return None;
    }
    Some(PwEntry {
        name: f[0],
        uid: f[2].parse().ok()?,
        gid: f[3].parse().ok()?,
        home: f[5],
        shell: f[6],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
        broken line\n\
        bad:x:notanumber:1::/x:/bin/sh\n\
        user:x:1000:1000:,,,:/home/user:/bin/bash\n\
        nohome:x:1001:1001:::/bin/sh\n";
    const GROUP: &str = "root:x:0:\nsudo:x:27:user\nusers:x:100:other,user\n\
        user:x:1000:\nweird\nnogid:x:abc:user\n";

    #[test]
    fn names_and_uids_resolve_with_their_groups() {
        let u = resolve("user", PASSWD, GROUP).unwrap();
        assert_eq!(
            u,
            Account {
                name: "user".into(),
                uid: 1000,
                gid: 1000,
                home: "/home/user".into(),
                shell: "/bin/bash".into(),
                groups: vec![1000, 27, 100],
            }
        );
        assert_eq!(resolve("1000", PASSWD, GROUP).unwrap(), u);
        let root = resolve("0", PASSWD, GROUP).unwrap();
        assert_eq!((root.name.as_str(), root.home.as_str()), ("root", "/root"));
        assert_eq!(root.groups, [0]);
        assert_eq!(resolve("nohome", PASSWD, GROUP).unwrap().home, "/");
    }

    /// Unknown users, uids without an entry, malformed lines and hostile names are
    /// `bad_request`, never a panic or a match on a broken line.
    #[test]
    fn hostile_and_unknown_users_are_bad_requests() {
        for who in [
            "nobody",
            "4242",
            "",
            "bad",
            "broken line",
            "a\0b",
            "user:x",
            "user\n",
            "-1",
            "99999999999",
        ] {
            let e = resolve(who, PASSWD, GROUP).unwrap_err();
            assert!(matches!(e, Error::BadRequest(_)), "{who:?}: {e}");
        }
        // Empty and garbage files resolve nothing.
        assert!(resolve("root", "", "").is_err());
        assert!(resolve("root", "\0\0:::::::\n::::::", "").is_err());
        // A missing group file leaves the primary group only.
        assert_eq!(resolve("user", PASSWD, "").unwrap().groups, [1000]);
    }

    #[test]
    fn env_flags() {
        assert_eq!(
            parse_env_flag("A=b=c").unwrap(),
            ("A".to_string(), "b=c".to_string())
        );
        for bad in ["", "=x", "A", "A\0=x", "A=x\0"] {
            assert!(parse_env_flag(bad).is_err(), "{bad:?}");
        }
    }
}
