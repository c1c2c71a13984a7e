// React Native provides a global `performance` (the engine times its steps with performance.now());
// its type declarations do not.
declare const performance: { now(): number };
