//! `/proc/self/mountinfo`, read once here for every crate of cowspace (the helper's
//! overlay detection, the runtime's mount table, git's fsmonitor hook).
//!
//! A line: `id parent maj:min root target options [optional...] - fstype source
//! superopts`; paths escape space, tab, newline and backslash as `\ooo` (octal).

/// One line of the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line<'a> {
    /// `maj:min` of the filesystem.
    pub dev: &'a str,
    /// The mount's root within its filesystem (unescaped).
    pub root: String,
    /// Where it is mounted (unescaped).
    pub target: String,
    pub fstype: &'a str,
    /// The mount source, as the table has it (escaped; [`unescape`] it where it is a
    /// path).
    pub source: &'a str,
    /// The filesystem's own options, as the table has them.
    pub superopts: &'a str,
}

/// The lines of `text` (a copy of the mount table), in order; malformed lines skipped.
pub fn lines(text: &str) -> impl DoubleEndedIterator<Item = Line<'_>> {
    text.lines().filter_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut l = left.split(' ');
        let dev = l.nth(2)?;
        let root = unescape(l.next()?);
        let target = unescape(l.next()?);
        let mut r = right.split(' ');
        Some(Line {
            dev,
            root,
            target,
            fstype: r.next().unwrap_or(""),
            source: r.next().unwrap_or(""),
            superopts: r.next().unwrap_or(""),
        })
    })
}

/// Reads this process's mount table.
pub fn read() -> std::io::Result<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
}

/// Decodes the octal escapes (`\040`) of the mount table.
pub fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_gives_its_fields_with_paths_unescaped() {
        let t = "36 27 0:45 / /r/ws\\040one/mnt rw,noatime shared:20 - overlay cowspace rw,lowerdir=/a\n\
                 garbage\n\
                 30 1 254:0 /sub /srv rw - ext4 /dev/vda rw\n";
        let v: Vec<_> = lines(t).collect();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].target, "/r/ws one/mnt");
        assert_eq!(
            (v[0].fstype, v[0].source, v[0].superopts),
            ("overlay", "cowspace", "rw,lowerdir=/a")
        );
        assert_eq!((v[1].dev, v[1].root.as_str()), ("254:0", "/sub"));
    }
}
