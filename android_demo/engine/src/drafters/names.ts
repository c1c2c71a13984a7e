/** Drafter names, as --drafter spells them (runtime/drafters/__init__.py). */

import { ConfigError } from '../errors';
import { SHARED } from '../shared';

export type DrafterName = 'medusa' | 'lookup' | 'feature' | 'recall';
// the Python runtime's names (shared.json) less the draft model, which this engine does not run
const NAMES = SHARED.drafters.filter((name): name is DrafterName => name !== 'model');

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
