/** The line under a reply: its tokens, speed, tokens accepted a step, tree sizes, KV use and finish reason. */
import type { ChatSession, Reply } from '@specmemo/engine';

function summarizeTree(sizes: readonly number[]): string {
  if (!sizes.length) return '–';
  const min = Math.min(...sizes);
  const max = Math.max(...sizes);
  const mean = sizes.reduce((a, b) => a + b, 0) / sizes.length;
  return min === max ? String(max) : `${min}–${max} (mean ${mean.toFixed(1)})`;
}

export function statsLine(reply: Reply, session: ChatSession): string {
  const s = reply.stats;
  const parts = [
    `${s.newTokens} tokens`,
    `${s.decodeTokensPerS.toFixed(1)} tok/s`,
    `${s.meanAccepted.toFixed(2)} accepted/step`,
    `T ${summarizeTree(s.treeSizes)}`,
    `KV ${session.kvUsed()}/${session.capacity}`,
    s.finishReason,
    `reused ${reply.reused}, prefilled ${reply.prefilled}`,
  ];
  if (reply.dropped) parts.push(`dropped ${reply.dropped} old turn${reply.dropped > 1 ? 's' : ''}`);
  return parts.join(' · ');
}
