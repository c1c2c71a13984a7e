/**
 * onnxruntime-web sessions that leave the page responsive.
 *
 * The WASM backend runs a session on the calling thread and resolves its promise without ever
 * giving the event loop a task boundary, so a whole reply runs as one long task: no token is painted
 * until the end, and Stop cannot be clicked. Each run here first yields a task (a MessageChannel
 * message: an ordinary task, queued behind input, timers and rendering; not scheduler.yield, whose
 * continuation goes ahead of them) once 12 ms have passed since the last yield, so the browser paints
 * the streamed tokens and handles input about once a frame.
 *
 * (Outputs: onnxruntime-web does not write pre-allocated CPU outputs back; the engine finds that on
 * its first run and asks for them by name from then on: engine/src/session.ts, OutputRoute.)
 */
import type { InferenceSession } from 'onnxruntime-common';
import type { OrtModule } from '@specmemo/engine';

type Fetches = InferenceSession.FetchesType;
type Results = InferenceSession.ReturnType;

const YIELD_EVERY_MS = 12;
let lastYield = 0;

/** A task boundary: the browser may render and dispatch input before the promise resolves. */
function nextTask(): Promise<void> {
  return new Promise((resolve) => {
    const channel = new MessageChannel();
    channel.port1.onmessage = () => {
      channel.port1.close();
      resolve();
    };
    channel.port2.postMessage(null);
  });
}

async function yieldIfDue(): Promise<void> {
  const now = performance.now();
  if (now - lastYield < YIELD_EVERY_MS) return;
  await nextTask();
  lastYield = performance.now();
}

class YieldingSession {
  constructor(private readonly inner: InferenceSession) {}

  get inputNames(): readonly string[] { return this.inner.inputNames; }
  get outputNames(): readonly string[] { return this.inner.outputNames; }
  get inputMetadata() { return this.inner.inputMetadata; }
  get outputMetadata() { return this.inner.outputMetadata; }

  async run(feeds: InferenceSession.FeedsType, fetches?: Fetches | InferenceSession.RunOptions,
    options?: InferenceSession.RunOptions): Promise<Results> {
    await yieldIfDue();
    return this.inner.run(feeds, fetches as Fetches, options as InferenceSession.RunOptions);
  }

  release(): Promise<void> { return this.inner.release(); }
  startProfiling(): void { this.inner.startProfiling(); }
  endProfiling(): void { this.inner.endProfiling(); }
}

/** `ort` whose sessions yield to the page between runs (see above). */
export function forThePage(ort: OrtModule): OrtModule {
  const create = (async (...args: unknown[]) => {
    const inner = await (ort.InferenceSession.create as (...a: unknown[]) => Promise<InferenceSession>)(...args);
    return new YieldingSession(inner);
  }) as OrtModule['InferenceSession']['create'];
  return { Tensor: ort.Tensor, InferenceSession: { create } };
}
