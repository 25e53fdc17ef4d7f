// Byte vectors follow the msgpack spec (github.com/msgpack/msgpack/blob/master/spec.md).
import { test } from "node:test";
import assert from "node:assert/strict";
import { encode, decode } from "../msgpack.js";

const hex = (s) => Uint8Array.from(s.match(/../g).map((h) => parseInt(h, 16)));
const toHex = (b) => Buffer.from(b).toString("hex");

const vectors = [
  [null, "c0"], [false, "c2"], [true, "c3"],
  [0, "00"], [127, "7f"], [128, "cc80"], [255, "ccff"], [256, "cd0100"], [65535, "cdffff"],
  [65536, "ce00010000"], [4294967295, "ceffffffff"], [4294967296, "cf0000000100000000"],
  [-1, "ff"], [-32, "e0"], [-33, "d0df"], [-128, "d080"], [-129, "d1ff7f"], [-32768, "d18000"],
  [-32769, "d2ffff7fff"], [-2147483648, "d280000000"], [-2147483649, "d3ffffffff7fffffff"],
  [1.5, "cb3ff8000000000000"], [-0, "cb8000000000000000"],
  ["", "a0"], ["a", "a161"], ["é", "a2c3a9"], ["x".repeat(31), "bf" + "78".repeat(31)],
  ["x".repeat(32), "d920" + "78".repeat(32)], ["x".repeat(256), "da0100" + "78".repeat(256)],
  [new Uint8Array([1, 2]), "c4020102"], [[], "90"], [[1, [2]], "920191 02".replace(" ", "")],
  [{}, "80"], [{ a: 1 }, "81a16101"],
];

test("encodes the spec's smallest forms", () => {
  for (const [v, h] of vectors) assert.equal(toHex(encode(v)), h, `encode ${JSON.stringify(v)}`);
});

test("decodes what it encodes", () => {
  for (const [v, h] of vectors) assert.deepEqual(decode(hex(h)), v, `decode ${h}`);
});

test("decodes wide forms other encoders choose", () => {
  assert.equal(decode(hex("cd0001")), 1);
  assert.equal(decode(hex("d000")), 0);
  assert.equal(decode(hex("ca3fc00000")), 1.5);                 // float32
  assert.equal(decode(hex("dc0000")).length, 0);                // array16
  assert.deepEqual(decode(hex("de0001a16101")), { a: 1 });      // map16
  assert.deepEqual(decode(hex("c50002ffee")), new Uint8Array([0xff, 0xee]));
  assert.equal(decode(hex("db00000001" + "7a")), "z");          // str32
});

test("64-bit integers beyond 2^53 come back as BigInt", () => {
  assert.equal(decode(hex("cfffffffffffffffff")), 0xffffffffffffffffn);
  assert.equal(decode(hex("d38000000000000000")), -0x8000000000000000n);
  assert.equal(toHex(encode(2n ** 63n)), "cf8000000000000000");
  assert.equal(decode(encode(2n ** 60n)), 2n ** 60n);
  assert.equal(decode(encode(42n)), 42);
  assert.throws(() => encode(2n ** 64n), RangeError);
});

test("large containers switch to 16 and 32-bit lengths", () => {
  const arr = Array.from({ length: 70000 }, (_, i) => i % 3);
  const b = encode(arr);
  assert.equal(b[0], 0xdd);
  assert.deepEqual(decode(b), arr);
  const obj = Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`k${i}`, i]));
  assert.equal(encode(obj)[0], 0xde);
  assert.deepEqual(decode(encode(obj)), obj);
  const bin = new Uint8Array(70000).fill(7);
  assert.equal(encode(bin)[0], 0xc6);
  assert.deepEqual(decode(encode(bin)), bin);
});

test("protocol frames round-trip; undefined fields are left out", () => {
  const frame = { type: "complete", id: 7, doc: "a.py", prefix: "def f(", suffix: ")\n",
                  language: "python", max_new_tokens: undefined, stream: true };
  const back = decode(encode(frame));
  assert.deepEqual(back, { type: "complete", id: 7, doc: "a.py", prefix: "def f(", suffix: ")\n",
                           language: "python", stream: true });
  const done = { type: "done", id: "r1", text: "x)", cancelled: false,
                 stats: { ttft_ms: 12.5, total_ms: 80.25, new_tokens: 3 } };
  assert.deepEqual(decode(encode(done)), done);
});

test("non-string map keys decode to a Map; __proto__ stays data", () => {
  const m = decode(hex("820102a1610a"));
  assert.ok(m instanceof Map);
  assert.equal(m.get(1), 2);
  assert.equal(m.get("a"), 10);
  const o = decode(encode(JSON.parse('{"__proto__": {"polluted": 1}}')));
  assert.equal(Object.getPrototypeOf(o), Object.prototype);
  assert.deepEqual(Object.keys(o), ["__proto__"]);
});

test("extension types decode as {ext, data}", () => {
  assert.deepEqual(decode(hex("d4ff07")), { ext: -1, data: new Uint8Array([7]) });
  assert.deepEqual(decode(hex("c70201aabb")), { ext: 1, data: new Uint8Array([0xaa, 0xbb]) });
});

test("malformed input throws instead of returning garbage", () => {
  assert.throws(() => decode(hex("c1")), /unused type byte/);
  assert.throws(() => decode(hex("a3616263ff")), /trailing/);
  assert.throws(() => decode(hex("a36162")), /truncated/);
  assert.throws(() => decode(hex("cd00")), /truncated/);
  assert.throws(() => decode(hex("a2c328")), TypeError);          // invalid UTF-8
  assert.throws(() => encode(() => 1), TypeError);
  assert.throws(() => encode(Symbol("s")), TypeError);
});

test("random values round-trip", () => {
  let seed = 12345;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
  const gen = (d) => {
    const k = Math.floor(rnd() * (d > 3 ? 6 : 8));
    switch (k) {
      case 0: return null;
      case 1: return rnd() < 0.5;
      case 2: return Math.floor((rnd() - 0.5) * 2 ** (1 + Math.floor(rnd() * 52)));
      case 3: return (rnd() - 0.5) * 1e6;
      case 4: return String.fromCodePoint(...Array.from({ length: Math.floor(rnd() * 40) },
        () => [0x41, 0xe9, 0x4e2d, 0x1f600][Math.floor(rnd() * 4)]));
      case 5: return Uint8Array.from({ length: Math.floor(rnd() * 10) }, () => Math.floor(rnd() * 256));
      case 6: return Array.from({ length: Math.floor(rnd() * 5) }, () => gen(d + 1));
      default: return Object.fromEntries(Array.from({ length: Math.floor(rnd() * 5) },
        (_, i) => [`k${i}`, gen(d + 1)]));
    }
  };
  for (let i = 0; i < 500; i++) {
    const v = gen(0);
    assert.deepEqual(decode(encode(v)), v);
  }
});
