/**
 * The numbers and names this engine shares with the Python runtime, from their one file:
 * specmemo/runtime/shared.json, copied into this package before every build and lint (package.json: prebuild,
 * prelint; src/shared.json is not committed). tests/test_shared.py fails where either side writes one itself.
 */
import shared from './shared.json';

export const SHARED = shared;
