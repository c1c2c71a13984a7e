/**
 * UTF-8 TextDecoder (and TextEncoder) where the JS engine has none. Hermes as shipped with
 * React Native 0.81 has TextEncoder but no TextDecoder, and tokenizers.js decodes byte-level
 * tokens with `new TextDecoder('utf-8', { fatal: false, ignoreBOM: true })`. Only UTF-8, only
 * whole buffers (no `stream`), malformed bytes as U+FFFD: what the tokenizer needs, nothing more.
 */

function decodeUtf8(bytes: Uint8Array, ignoreBOM: boolean): string {
  const units: number[] = [];
  let out = '';
  let i = ignoreBOM || !(bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf) ? 0 : 3;
  while (i < bytes.length) {
    const b = bytes[i];
    const need = b < 0x80 ? 0 : b >= 0xc2 && b < 0xe0 ? 1 : b >= 0xe0 && b < 0xf0 ? 2 : b >= 0xf0 && b < 0xf5 ? 3 : -1;
    let cp = need === 0 ? b : need === 1 ? b & 0x1f : need === 2 ? b & 0x0f : b & 0x07;
    let n = 0;
    // continuation bytes; the second byte's range also rules out overlongs, surrogates and > U+10FFFF
    const low = (b === 0xe0 ? 0xa0 : b === 0xf0 ? 0x90 : 0x80);
    const high = (b === 0xed ? 0x9f : b === 0xf4 ? 0x8f : 0xbf);
    while (n < need && i + 1 + n < bytes.length) {
      const c = bytes[i + 1 + n];
      if (c < (n === 0 ? low : 0x80) || c > (n === 0 ? high : 0xbf)) break;
      cp = (cp << 6) | (c & 0x3f);
      n++;
    }
    if (need < 0 || n < need) {
      units.push(0xfffd); // one replacement for the maximal invalid subpart
      i += Math.max(1, n + (need < 0 ? 0 : 1));
    } else {
      if (cp >= 0x10000) units.push(0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff));
      else units.push(cp);
      i += need + 1;
    }
    if (units.length >= 4096) {
      out += String.fromCharCode(...units);
      units.length = 0;
    }
  }
  return out + String.fromCharCode(...units);
}

class Utf8Decoder {
  readonly encoding = 'utf-8';
  readonly fatal = false;
  readonly ignoreBOM: boolean;

  constructor(label = 'utf-8', options: { fatal?: boolean; ignoreBOM?: boolean } = {}) {
    if (!/^\s*(utf-?8|unicode-1-1-utf-8)\s*$/i.test(label)) throw new RangeError(`TextDecoder: only utf-8 here, not ${label}`);
    if (options.fatal) throw new TypeError('TextDecoder: fatal mode is not supported here');
    this.ignoreBOM = options.ignoreBOM ?? false;
  }

  decode(input?: ArrayBuffer | ArrayBufferView): string {
    if (input === undefined) return '';
    const bytes = input instanceof ArrayBuffer
      ? new Uint8Array(input)
      : new Uint8Array(input.buffer, input.byteOffset, input.byteLength);
    return decodeUtf8(bytes, this.ignoreBOM);
  }
}

class Utf8Encoder {
  readonly encoding = 'utf-8';

  encode(text = ''): Uint8Array {
    const bytes: number[] = [];
    for (const ch of text) {
      let cp = ch.codePointAt(0)!;
      if (cp >= 0xd800 && cp < 0xe000) cp = 0xfffd; // a lone surrogate
      if (cp < 0x80) bytes.push(cp);
      else if (cp < 0x800) bytes.push(0xc0 | (cp >> 6), 0x80 | (cp & 0x3f));
      else if (cp < 0x10000) bytes.push(0xe0 | (cp >> 12), 0x80 | ((cp >> 6) & 0x3f), 0x80 | (cp & 0x3f));
      else bytes.push(0xf0 | (cp >> 18), 0x80 | ((cp >> 12) & 0x3f), 0x80 | ((cp >> 6) & 0x3f), 0x80 | (cp & 0x3f));
    }
    return new Uint8Array(bytes);
  }
}

const g = globalThis as Record<string, unknown>;
if (typeof g.TextDecoder === 'undefined') g.TextDecoder = Utf8Decoder;
if (typeof g.TextEncoder === 'undefined') g.TextEncoder = Utf8Encoder;

export { decodeUtf8 };
