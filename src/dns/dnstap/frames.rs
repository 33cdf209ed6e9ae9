//! Frame Streams (the `fstrm` protocol dnstap travels in), the writer's side of its
//! bidirectional handshake.
//!
//! ```text
//! data frame:    length (u32 BE, > 0) | payload
//! control frame: 0 (u32) | length (u32 BE) | type (u32 BE) | fields…
//! field:         CONTENT_TYPE (1, u32 BE) | length (u32 BE) | bytes
//! writer ─READY(types)─▶ reader ─ACCEPT(type)─▶ writer ─START(type)─▶ data… ─STOP─▶
//!                                                       reader ─FINISH─▶ (closed)
//! ```

use std::io::{self, Read};

/// The content type of dnstap's protobuf payloads.
pub(super) const CONTENT_TYPE: &[u8] = b"protobuf:dnstap.Dnstap";

pub(super) const ACCEPT: u32 = 0x01;
pub(super) const START: u32 = 0x02;
pub(super) const STOP: u32 = 0x03;
pub(super) const READY: u32 = 0x04;
pub(super) const FINISH: u32 = 0x05;
const FIELD_CONTENT_TYPE: u32 = 1;
/// The longest control frame read (fstrm's own limit is 512 bytes).
const MAX_CONTROL: usize = 512;

/// Appends a control frame of `kind`, naming `content_type` if given, to `out`.
pub(super) fn control(kind: u32, content_type: Option<&[u8]>, out: &mut Vec<u8>) {
    let fields = content_type.map_or(0, |t| 8 + t.len());
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&((4 + fields) as u32).to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    if let Some(t) = content_type {
        out.extend_from_slice(&FIELD_CONTENT_TYPE.to_be_bytes());
        out.extend_from_slice(&(t.len() as u32).to_be_bytes());
        out.extend_from_slice(t);
    }
}

/// Appends a data frame holding `payload` to `out`.
pub(super) fn data(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// A control frame's type and the content types it names, from its body (what
/// follows the escape and the length).
pub(super) fn parse_control(body: &[u8]) -> Option<(u32, Vec<&[u8]>)> {
    let word = |at: usize| -> Option<u32> {
        let b = body.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let kind = word(0)?;
    let mut types = Vec::new();
    let mut at = 4;
    while at < body.len() {
        let field = word(at)?;
        let len = word(at + 4)? as usize;
        let value = body.get(at + 8..at + 8 + len)?;
        if field == FIELD_CONTENT_TYPE {
            types.push(value);
        }
        at += 8 + len;
    }
    Some((kind, types))
}

/// Reads one control frame from `r` (within its read timeout): its type and whether it
/// names [`CONTENT_TYPE`] (or names no type at all).
pub(super) fn read_control(r: &mut impl Read) -> io::Result<(u32, bool)> {
    let mut head = [0u8; 8];
    r.read_exact(&mut head)?;
    let escape = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let len = u32::from_be_bytes([head[4], head[5], head[6], head[7]]) as usize;
    if escape != 0 || !(4..=MAX_CONTROL).contains(&len) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a Frame Streams control frame",
        ));
    }
    let mut body = [0u8; MAX_CONTROL];
    r.read_exact(&mut body[..len])?;
    let (kind, types) = parse_control(&body[..len])
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad control frame"))?;
    let ours = types.is_empty() || types.contains(&CONTENT_TYPE);
    Ok((kind, ours))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_frames_are_laid_out_as_fstrm_reads_them() {
        let mut out = Vec::new();
        control(READY, Some(CONTENT_TYPE), &mut out);
        let mut want = vec![0, 0, 0, 0, 0, 0, 0, 34, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 22];
        want.extend_from_slice(b"protobuf:dnstap.Dnstap");
        assert_eq!(out, want);
        out.clear();
        control(STOP, None, &mut out);
        assert_eq!(out, [0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 3]);
        out.clear();
        data(b"abc", &mut out);
        assert_eq!(out, [0, 0, 0, 3, b'a', b'b', b'c']);
    }

    #[test]
    fn an_accept_is_read_back_with_its_content_type() {
        let mut frame = Vec::new();
        control(ACCEPT, Some(CONTENT_TYPE), &mut frame);
        assert_eq!(read_control(&mut &frame[..]).unwrap(), (ACCEPT, true));
        frame.clear();
        control(ACCEPT, Some(b"protobuf:other"), &mut frame);
        assert_eq!(read_control(&mut &frame[..]).unwrap(), (ACCEPT, false));
        frame.clear();
        control(FINISH, None, &mut frame);
        assert_eq!(read_control(&mut &frame[..]).unwrap(), (FINISH, true));
        // A data frame, a cut frame, an oversized length: errors, no panic.
        assert!(read_control(&mut &[0, 0, 0, 3, 1, 2, 3][..]).is_err());
        assert!(read_control(&mut &frame[..6]).is_err());
        assert!(read_control(&mut &[0, 0, 0, 0, 0, 1, 0, 0][..]).is_err());
        assert!(parse_control(&[0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 9]).is_none());
    }
}
