"""A small MaxMind DB (.mmdb) reader and writer, standard library only.

Written for benches/scope from the format specification
(https://maxmind.github.io/MaxMind-DB/): enough to walk every network of a database's
search tree (with data or empty) and to write a GeoIP2-Country-shaped database with the
same network boundaries. Not a general-purpose library: no lookups, no IPv4 aliases are
written, data records are small maps.
"""

import struct
import time

METADATA_MARKER = b"\xab\xcd\xefMaxMind.com"

# Data section type numbers (the specification's "data field format").
T_POINTER, T_UTF8, T_DOUBLE, T_BYTES, T_UINT16, T_UINT32, T_MAP = 1, 2, 3, 4, 5, 6, 7
T_INT32, T_UINT64, T_UINT128, T_ARRAY, T_CONTAINER, T_END, T_BOOL, T_FLOAT = (
    8, 9, 10, 11, 12, 13, 14, 15)


class FormatError(Exception):
    pass


class Decoder:
    """Decodes data section values; pointers are relative to `base`."""

    def __init__(self, buf, base):
        self.buf = buf
        self.base = base

    def _ctrl(self, off):
        buf = self.buf
        ctrl = buf[off]
        off += 1
        kind = ctrl >> 5
        if kind == T_POINTER:
            return kind, ctrl, off
        if kind == 0:
            kind = 7 + buf[off]
            off += 1
        size = ctrl & 0x1F
        if size == 29:
            size = 29 + buf[off]
            off += 1
        elif size == 30:
            size = 285 + int.from_bytes(buf[off:off + 2], "big")
            off += 2
        elif size == 31:
            size = 65821 + int.from_bytes(buf[off:off + 3], "big")
            off += 3
        return kind, size, off

    def decode(self, off):
        """(value, offset after it)."""
        buf = self.buf
        kind, size, off = self._ctrl(off)
        if kind == T_POINTER:
            ctrl = size
            ss, vvv = (ctrl >> 3) & 3, ctrl & 7
            if ss == 0:
                ptr = (vvv << 8) | buf[off]
            elif ss == 1:
                ptr = ((vvv << 16) | int.from_bytes(buf[off:off + 2], "big")) + 2048
            elif ss == 2:
                ptr = ((vvv << 24) | int.from_bytes(buf[off:off + 3], "big")) + 526336
            else:
                ptr = int.from_bytes(buf[off:off + 4], "big")
            value, _ = self.decode(self.base + ptr)
            return value, off + ss + 1
        if kind == T_UTF8:
            return buf[off:off + size].decode("utf-8"), off + size
        if kind == T_BYTES:
            return bytes(buf[off:off + size]), off + size
        if kind == T_DOUBLE:
            return struct.unpack(">d", buf[off:off + 8])[0], off + 8
        if kind == T_FLOAT:
            return struct.unpack(">f", buf[off:off + 4])[0], off + 4
        if kind in (T_UINT16, T_UINT32, T_UINT64, T_UINT128):
            return int.from_bytes(buf[off:off + size], "big"), off + size
        if kind == T_INT32:
            raw = int.from_bytes(buf[off:off + size], "big")
            if size == 4 and raw >= 1 << 31:
                raw -= 1 << 32
            return raw, off + size
        if kind == T_BOOL:
            return bool(size), off
        if kind == T_MAP:
            out = {}
            for _ in range(size):
                key, off = self.decode(off)
                out[key], off = self.decode(off)
            return out, off
        if kind == T_ARRAY:
            out = []
            for _ in range(size):
                item, off = self.decode(off)
                out.append(item)
            return out, off
        raise FormatError(f"data type {kind} at offset {off} is not supported")


class Reader:
    """The search tree and data of one database file, read whole into memory."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        at = self.buf.rfind(METADATA_MARKER)
        if at < 0:
            raise FormatError(f"{path}: no MaxMind DB metadata marker")
        start = at + len(METADATA_MARKER)
        self.metadata, _ = Decoder(self.buf, start).decode(start)
        self.node_count = self.metadata["node_count"]
        self.record_size = self.metadata["record_size"]
        self.ip_version = self.metadata["ip_version"]
        if self.record_size not in (24, 28, 32):
            raise FormatError(f"{path}: record size {self.record_size}")
        self.node_bytes = self.record_size // 4
        self.tree_size = self.node_count * self.node_bytes
        self.data = Decoder(self.buf, self.tree_size + 16)
        self._cache = {}

    def records(self, node):
        """(left, right) records of a node."""
        b = self.buf
        o = node * self.node_bytes
        if self.record_size == 24:
            return (int.from_bytes(b[o:o + 3], "big"), int.from_bytes(b[o + 3:o + 6], "big"))
        if self.record_size == 28:
            mid = b[o + 3]
            return (((mid >> 4) << 24) | int.from_bytes(b[o:o + 3], "big"),
                    ((mid & 0x0F) << 24) | int.from_bytes(b[o + 4:o + 7], "big"))
        return (int.from_bytes(b[o:o + 4], "big"), int.from_bytes(b[o + 4:o + 8], "big"))

    def value(self, record):
        """The data a leaf record points to (None for the empty record); cached."""
        if record == self.node_count:
            return None
        if record < self.node_count:
            raise FormatError(f"record {record} is a node, not data")
        v = self._cache.get(record)
        if v is None:
            off = record - self.node_count + self.tree_size
            v, _ = self.data.decode(off)
            self._cache[record] = v
        return v

    def ipv4_start(self):
        """The record the IPv4 space starts at: the root of an IPv4 database, or
        the node reached by 96 zero bits in an IPv6 one (::/96)."""
        rec = 0
        if self.ip_version == 6:
            for _ in range(96):
                if rec >= self.node_count:
                    break
                rec = self.records(rec)[0]
        return rec

    def leaves(self, start_record, bits, skip=None):
        """Every network below a record, in address order, as (first address, prefix
        length, leaf record); `bits` is the width of the address space below it.
        A record in `skip` (an alias of another subtree) is not walked into."""
        out = []
        stack = [(start_record, 0, 0)]
        nc = self.node_count
        while stack:
            rec, depth, first = stack.pop()
            if rec < nc and depth < bits:
                if skip is not None and depth > 0 and rec in skip:
                    continue
                left, right = self.records(rec)
                half = 1 << (bits - depth - 1)
                stack.append((right, depth + 1, first | half))
                stack.append((left, depth + 1, first))
            else:
                if rec < nc:
                    raise FormatError("the tree is deeper than the address")
                out.append((first, depth, rec))
        return out


# --- writing ---------------------------------------------------------------------------

def _ctrl_bytes(kind, size):
    if size < 29:
        head, extra = size, b""
    elif size < 285:
        head, extra = 29, bytes([size - 29])
    elif size < 65821:
        head, extra = 30, (size - 285).to_bytes(2, "big")
    else:
        head, extra = 31, (size - 65821).to_bytes(3, "big")
    if kind < 8:
        return bytes([(kind << 5) | head]) + extra
    return bytes([head, kind - 7]) + extra


def encode(value):
    """Encodes str, bool, non-negative int (as uint32, or uint64 when larger), dict, list."""
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return _ctrl_bytes(T_UTF8, len(raw)) + raw
    if isinstance(value, bool):
        return _ctrl_bytes(T_BOOL, int(value))
    if isinstance(value, int):
        if value < 0:
            raise ValueError("negative integers are not supported")
        kind = T_UINT32 if value < 1 << 32 else T_UINT64
        raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
        return _ctrl_bytes(kind, len(raw)) + raw
    if isinstance(value, dict):
        out = _ctrl_bytes(T_MAP, len(value))
        for k, v in value.items():
            out += encode(str(k)) + encode(v)
        return out
    if isinstance(value, list):
        out = _ctrl_bytes(T_ARRAY, len(value))
        for v in value:
            out += encode(v)
        return out
    raise ValueError(f"cannot encode {type(value).__name__}")


def _uint16(value):
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return _ctrl_bytes(T_UINT16, len(raw)) + raw


def write(path, networks, values, database_type, description):
    """Writes an IPv6 database (IPv4 at ::/96, no aliases).

    networks: sorted, non-overlapping (first address as a 128-bit int, prefix length in
    the 128-bit space, key), where key indexes `values` or is None for a network without
    data (kept as an empty leaf, so the tree has exactly these networks' boundaries).
    values: {key: dict}.
    """
    data = b""
    data_off = {}
    for key, v in values.items():
        data_off[key] = len(data)
        data += encode(v)

    firsts = [n[0] for n in networks]
    nodes = []  # [left, right]: ("n", id) | ("d", key) | None (empty)

    def build(lo, hi, depth, first):
        if lo == hi:
            return None
        if hi - lo == 1 and networks[lo][1] == depth:
            key = networks[lo][2]
            return None if key is None else ("d", key)
        if depth >= 128 or any(networks[i][1] <= depth for i in (lo, hi - 1)):
            raise ValueError(f"overlapping networks at depth {depth}")
        nid = len(nodes)
        nodes.append(None)
        mid = first | (1 << (127 - depth))
        # first network at or past the middle: binary search in firsts[lo:hi]
        a, b = lo, hi
        while a < b:
            m = (a + b) // 2
            if firsts[m] < mid:
                a = m + 1
            else:
                b = m
        left = build(lo, a, depth + 1, first)
        right = build(a, hi, depth + 1, mid)
        nodes[nid] = (left, right)
        return ("n", nid)

    root = build(0, len(networks), 0, 0)
    if root is None or root[0] != "n":
        raise ValueError("a database needs at least two networks")
    count = len(nodes)

    def num(rec):
        if rec is None:
            return count
        if rec[0] == "n":
            return rec[1]
        return count + 16 + data_off[rec[1]]

    top = count + 16 + len(data)
    record_size = 24 if top < 1 << 24 else 28 if top < 1 << 28 else 32
    tree = bytearray()
    for left, right in nodes:
        lv, rv = num(left), num(right)
        if record_size == 24:
            tree += lv.to_bytes(3, "big") + rv.to_bytes(3, "big")
        elif record_size == 28:
            tree += ((lv & 0xFFFFFF).to_bytes(3, "big") + bytes([((lv >> 24) << 4) | (rv >> 24)])
                     + (rv & 0xFFFFFF).to_bytes(3, "big"))
        else:
            tree += lv.to_bytes(4, "big") + rv.to_bytes(4, "big")

    meta = _ctrl_bytes(T_MAP, 9)
    meta += encode("binary_format_major_version") + _uint16(2)
    meta += encode("binary_format_minor_version") + _uint16(0)
    meta += encode("build_epoch") + _ctrl_bytes(T_UINT64, 8) + int(time.time()).to_bytes(8, "big")
    meta += encode("database_type") + encode(database_type)
    meta += encode("description") + encode({"en": description})
    meta += encode("ip_version") + _uint16(6)
    meta += encode("languages") + encode(["en"])
    meta += encode("node_count") + encode(count)
    meta += encode("record_size") + _uint16(record_size)

    with open(path, "wb") as f:
        f.write(tree)
        f.write(b"\0" * 16)
        f.write(data)
        f.write(METADATA_MARKER)
        f.write(meta)
    return count, record_size
