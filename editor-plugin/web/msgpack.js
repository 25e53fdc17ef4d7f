// A small msgpack codec for the completer WebSocket protocol (https://msgpack.org spec).
// Owns: encode(value) -> Uint8Array and decode(bytes) -> value for nil, booleans, integers,
// floats, UTF-8 strings, binary, arrays and maps. Extension types decode to {ext, data} and
// are never produced. Integers outside ±2^53 decode to BigInt so no id is silently rounded.

const utf8enc = new TextEncoder();
const utf8dec = new TextDecoder("utf-8", { fatal: true });

class Writer {
  constructor() {
    this.buf = new Uint8Array(256);
    this.view = new DataView(this.buf.buffer);
    this.pos = 0;
  }
  reserve(n) {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.pos));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }
  u8(v) { this.reserve(1); this.buf[this.pos++] = v; }
  u16(v) { this.reserve(2); this.view.setUint16(this.pos, v); this.pos += 2; }
  u32(v) { this.reserve(4); this.view.setUint32(this.pos, v); this.pos += 4; }
  u64(v) { this.reserve(8); this.view.setBigUint64(this.pos, BigInt(v)); this.pos += 8; }
  i8(v) { this.reserve(1); this.view.setInt8(this.pos, v); this.pos += 1; }
  i16(v) { this.reserve(2); this.view.setInt16(this.pos, v); this.pos += 2; }
  i32(v) { this.reserve(4); this.view.setInt32(this.pos, v); this.pos += 4; }
  i64(v) { this.reserve(8); this.view.setBigInt64(this.pos, BigInt(v)); this.pos += 8; }
  f64(v) { this.reserve(8); this.view.setFloat64(this.pos, v); this.pos += 8; }
  bytes(b) { this.reserve(b.length); this.buf.set(b, this.pos); this.pos += b.length; }
}

function writeInt(w, v) {
  // v: a safe-integer Number or a BigInt; the smallest encoding wins.
  const big = typeof v === "bigint";
  if (v >= 0) {
    if (v < 128) w.u8(Number(v));
    else if (v < 256) { w.u8(0xcc); w.u8(Number(v)); }
    else if (v < 65536) { w.u8(0xcd); w.u16(Number(v)); }
    else if (v < 4294967296) { w.u8(0xce); w.u32(Number(v)); }
    else {
      if (big && v > 0xffffffffffffffffn) throw new RangeError("msgpack: integer above 2^64-1");
      w.u8(0xcf); w.u64(v);
    }
  } else {
    if (v >= -32) w.u8(Number(v) & 0xff);
    else if (v >= -128) { w.u8(0xd0); w.i8(Number(v)); }
    else if (v >= -32768) { w.u8(0xd1); w.i16(Number(v)); }
    else if (v >= -2147483648) { w.u8(0xd2); w.i32(Number(v)); }
    else {
      if (big && v < -0x8000000000000000n) throw new RangeError("msgpack: integer below -2^63");
      w.u8(0xd3); w.i64(v);
    }
  }
}

function writeLen(w, n, fix, fixMax, op8, op16, op32) {
  if (fix !== null && n <= fixMax) w.u8(fix | n);
  else if (op8 !== null && n < 256) { w.u8(op8); w.u8(n); }
  else if (n < 65536) { w.u8(op16); w.u16(n); }
  else if (n < 4294967296) { w.u8(op32); w.u32(n); }
  else throw new RangeError("msgpack: length above 2^32-1");
}

function write(w, v, depth) {
  if (depth > 512) throw new RangeError("msgpack: nesting deeper than 512");
  if (v === null || v === undefined) { w.u8(0xc0); return; }
  switch (typeof v) {
    case "boolean": w.u8(v ? 0xc3 : 0xc2); return;
    case "bigint": writeInt(w, v); return;
    case "number":
      if (Number.isSafeInteger(v) && !Object.is(v, -0)) writeInt(w, v);
      else { w.u8(0xcb); w.f64(v); }
      return;
    case "string": {
      const b = utf8enc.encode(v);
      writeLen(w, b.length, 0xa0, 31, 0xd9, 0xda, 0xdb);
      w.bytes(b);
      return;
    }
    case "object": break;
    default: throw new TypeError(`msgpack: cannot encode a ${typeof v}`);
  }
  if (v instanceof Uint8Array || v instanceof ArrayBuffer) {
    const b = v instanceof ArrayBuffer ? new Uint8Array(v) : v;
    writeLen(w, b.length, null, 0, 0xc4, 0xc5, 0xc6);
    w.bytes(b);
  } else if (Array.isArray(v)) {
    writeLen(w, v.length, 0x90, 15, null, 0xdc, 0xdd);
    for (const x of v) write(w, x, depth + 1);
  } else {
    // Keys whose value is undefined are left out, as JSON.stringify does: optional fields stay optional.
    const entries = v instanceof Map ? [...v.entries()]
      : Object.entries(v).filter(([, x]) => x !== undefined);
    writeLen(w, entries.length, 0x80, 15, null, 0xde, 0xdf);
    for (const [k, x] of entries) { write(w, k, depth + 1); write(w, x, depth + 1); }
  }
}

/** Encode a value as one msgpack object. */
export function encode(value) {
  const w = new Writer();
  write(w, value, 0);
  return w.buf.slice(0, w.pos);
}

class Reader {
  constructor(bytes) {
    this.buf = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
  }
  need(n) {
    if (this.pos + n > this.buf.length) throw new RangeError("msgpack: truncated input");
  }
  u8() { this.need(1); return this.buf[this.pos++]; }
  u16() { this.need(2); const v = this.view.getUint16(this.pos); this.pos += 2; return v; }
  u32() { this.need(4); const v = this.view.getUint32(this.pos); this.pos += 4; return v; }
  u64() { this.need(8); const v = this.view.getBigUint64(this.pos); this.pos += 8; return narrow(v); }
  i8() { this.need(1); const v = this.view.getInt8(this.pos); this.pos += 1; return v; }
  i16() { this.need(2); const v = this.view.getInt16(this.pos); this.pos += 2; return v; }
  i32() { this.need(4); const v = this.view.getInt32(this.pos); this.pos += 4; return v; }
  i64() { this.need(8); const v = this.view.getBigInt64(this.pos); this.pos += 8; return narrow(v); }
  f32() { this.need(4); const v = this.view.getFloat32(this.pos); this.pos += 4; return v; }
  f64() { this.need(8); const v = this.view.getFloat64(this.pos); this.pos += 8; return v; }
  bytes(n) { this.need(n); const b = this.buf.slice(this.pos, this.pos + n); this.pos += n; return b; }
  str(n) { this.need(n); const s = utf8dec.decode(this.buf.subarray(this.pos, this.pos + n)); this.pos += n; return s; }
}

function narrow(big) {
  return big >= BigInt(Number.MIN_SAFE_INTEGER) && big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
}

function readArray(r, n, depth) {
  const out = new Array(n);
  for (let i = 0; i < n; i++) out[i] = read(r, depth + 1);
  return out;
}

function readMap(r, n, depth) {
  // Plain objects for the protocol's string keys; a Map when any key is not a string.
  const keys = new Array(n), vals = new Array(n);
  let allStrings = true;
  for (let i = 0; i < n; i++) {
    keys[i] = read(r, depth + 1);
    vals[i] = read(r, depth + 1);
    if (typeof keys[i] !== "string") allStrings = false;
  }
  if (!allStrings) return new Map(keys.map((k, i) => [k, vals[i]]));
  const out = {};
  for (let i = 0; i < n; i++) {
    Object.defineProperty(out, keys[i], { value: vals[i], enumerable: true, writable: true, configurable: true });
  }
  return out;
}

function read(r, depth) {
  if (depth > 512) throw new RangeError("msgpack: nesting deeper than 512");
  const b = r.u8();
  if (b <= 0x7f) return b;
  if (b >= 0xe0) return b - 256;
  if ((b & 0xf0) === 0x80) return readMap(r, b & 0x0f, depth);
  if ((b & 0xf0) === 0x90) return readArray(r, b & 0x0f, depth);
  if ((b & 0xe0) === 0xa0) return r.str(b & 0x1f);
  switch (b) {
    case 0xc0: return null;
    case 0xc2: return false;
    case 0xc3: return true;
    case 0xc4: return r.bytes(r.u8());
    case 0xc5: return r.bytes(r.u16());
    case 0xc6: return r.bytes(r.u32());
    case 0xc7: { const n = r.u8(); return { ext: r.i8(), data: r.bytes(n) }; }
    case 0xc8: { const n = r.u16(); return { ext: r.i8(), data: r.bytes(n) }; }
    case 0xc9: { const n = r.u32(); return { ext: r.i8(), data: r.bytes(n) }; }
    case 0xca: return r.f32();
    case 0xcb: return r.f64();
    case 0xcc: return r.u8();
    case 0xcd: return r.u16();
    case 0xce: return r.u32();
    case 0xcf: return r.u64();
    case 0xd0: return r.i8();
    case 0xd1: return r.i16();
    case 0xd2: return r.i32();
    case 0xd3: return r.i64();
    case 0xd4: return { ext: r.i8(), data: r.bytes(1) };
    case 0xd5: return { ext: r.i8(), data: r.bytes(2) };
    case 0xd6: return { ext: r.i8(), data: r.bytes(4) };
    case 0xd7: return { ext: r.i8(), data: r.bytes(8) };
    case 0xd8: return { ext: r.i8(), data: r.bytes(16) };
    case 0xd9: return r.str(r.u8());
    case 0xda: return r.str(r.u16());
    case 0xdb: return r.str(r.u32());
    case 0xdc: return readArray(r, r.u16(), depth);
    case 0xdd: return readArray(r, r.u32(), depth);
    case 0xde: return readMap(r, r.u16(), depth);
    case 0xdf: return readMap(r, r.u32(), depth);
    default: throw new RangeError(`msgpack: unused type byte 0x${b.toString(16)}`);
  }
}

/** Decode exactly one msgpack object; trailing bytes are an error. */
export function decode(bytes) {
  const u8 = bytes instanceof ArrayBuffer ? new Uint8Array(bytes) : bytes;
  const r = new Reader(u8);
  const v = read(r, 0);
  if (r.pos !== u8.length) throw new RangeError(`msgpack: ${u8.length - r.pos} trailing bytes`);
  return v;
}
