/**
 * Tokenizer and chat template from the artifact (runtime/tokenizer.py): Hugging Face's
 * tokenizers.js over tokenizer.json and @huggingface/jinja over the manifest's chat template,
 * rendered as `apply_chat_template` renders it; text is encoded without adding special tokens.
 */

import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';

import { TokenizerInfo } from './manifest';

export interface Message {
  role: 'system' | 'user' | 'assistant';
  content: string;
}

export class ChatTokenizer {
  readonly eosTokenIds: ReadonlySet<number>;
  private readonly tokenizer: Tokenizer;
  private readonly template: Template | null;

  constructor(tokenizerJson: string, readonly info: TokenizerInfo) {
    const json = JSON.parse(tokenizerJson) as { model?: { unk_token?: string; vocab?: Record<string, number> } };
    this.tokenizer = new Tokenizer(json, {});
    const unk = json.model?.unk_token;
    this.unknown = unk === undefined ? undefined : json.model?.vocab?.[unk];
    this.eosTokenIds = new Set(info.eos_token_ids);
    this.template = info.chat_template ? new Template(info.chat_template) : null;
    // what HF's apply_chat_template hands every template besides the messages (Gemma's starts with bos_token)
    this.bosToken = info.bos_token_id === null ? undefined
      : this.tokenizer.decode([info.bos_token_id], { skip_special_tokens: false, clean_up_tokenization_spaces: false });
  }

  private readonly bosToken: string | undefined;
  private readonly unknown: number | undefined; // the model's unk id: tokenizers.js leaves a word-level miss undefined

  /** Ids as Hugging Face's tokenizers give them: a piece the vocabulary lacks is the unk token (HF's rule). */
  private ids(text: string): number[] {
    const ids = this.tokenizer.encode(text, { add_special_tokens: false }).ids;
    return ids.map((id) => {
      if (id !== undefined) return id;
      if (this.unknown === undefined) throw new Error(`the tokenizer has no id for a piece of ${JSON.stringify(text.slice(0, 40))} and no unk token`);
      return this.unknown;
    });
  }

  render(messages: readonly Message[], addGenerationPrompt = true): string {
    if (this.template === null) return messages.map((m) => m.content).join('\n'); // a base model
    return this.template.render({
      messages: messages.map((m) => ({ role: m.role, content: m.content })),
      add_generation_prompt: addGenerationPrompt,
      ...(this.bosToken === undefined ? {} : { bos_token: this.bosToken }),
    });
  }

  encode(text: string): number[] {
    const ids = this.ids(text);
    const bos = this.info.bos_token_id;
    return this.info.add_bos_token && bos !== null && ids[0] !== bos ? [bos, ...ids] : ids;
  }

  /** `text` as the tokenizer splits it, nothing added (a grammar's forced text). */
  encodeRaw(text: string): number[] {
    return this.ids(text);
  }

  encodeChat(messages: readonly Message[]): number[] {
    return this.encode(this.render(messages));
  }

  decode(ids: readonly number[]): string {
    return this.tokenizer.decode([...ids], { skip_special_tokens: true, clean_up_tokenization_spaces: false });
  }
}
