/** Drafter names, as --drafter spells them (runtime/drafters/__init__.py). */

import { ConfigError } from '../errors';

export type DrafterName = 'medusa' | 'lookup' | 'feature' | 'recall';
const NAMES: readonly DrafterName[] = ['medusa', 'lookup', 'feature', 'recall'];

/** 'medusa+lookup' → ['medusa', 'lookup']; a one-line error naming the choices otherwise. */
export function parseDrafter(spec: string): DrafterName[] {
  const names: DrafterName[] = [];
  for (const part of spec.split('+').map((p) => p.trim())) {
    if (!(NAMES as readonly string[]).includes(part)) {
      throw new ConfigError(`unknown drafter ${JSON.stringify(part)} in ${JSON.stringify(spec)}: use one of ${NAMES.join(', ')} or several joined by '+'`);
    }
    if (names.includes(part as DrafterName)) throw new ConfigError(`drafter ${JSON.stringify(part)} is named twice in ${JSON.stringify(spec)}`);
    names.push(part as DrafterName);
  }
  return names;
}

/** `names` with the recall drafter merged in (runtime/drafters/__init__.py with_recall), for an engine given a store. */
export function withRecall(names: readonly DrafterName[]): DrafterName[] {
  return names.includes('recall') ? [...names] : [...names, 'recall'];
}
