//! Pre-tokenization: cutting text into words before BPE sees it.
//!
//! BPE merges never cross a word boundary, so the split decides, for instance, that `" the"`
//! (with its space) is one word, that digits are not glued to letters, and that `"'s"` stands
//! alone. Each vocabulary was trained with one splitting rule, written as regexes in its
//! `tokenizer.json`; GGUF names the rule in `tokenizer.ggml.pre`, and llama.cpp keeps a table
//! from those names to its own copy of the regexes. Both tables are here:
//! [`PRE_NAMES`] (name → rule and the flags llama.cpp sets with it) and
//! [`PreTokenizer::regexes`] (rule → regexes).
//!
//! A rule is a list of regexes applied in turn: the first cuts the text into its matches and
//! the stretches between them, the second cuts each of those pieces again, and so on. llama.cpp
//! runs the most common regexes with hand-written scanners (`unicode_regex_split_custom_*`) and
//! the others with a regex engine on a "collapsed" text; [`Splitter`] does the same, with the
//! scanners in `pretokenize/scan.rs` (and one more, for SmolLM2's `\p{N}`) and the engine in
//! `pretokenize/regex.rs`. [`RegexSplitter`] runs every regex that
//! has a scanner through the engine instead: shorter to read, slower to run, and a check on
//! the scanners.

mod regex;
mod scan;

use crate::unicode::{Class, class_of};
use regex::{LlamaRegex, Mapped};
use scan::Scanner;
use std::cell::OnceCell;
use std::ops::Range;

/// llama.cpp's pre-tokenizer rules (`LLAMA_VOCAB_PRE_TYPE_*`). Several names may select one
/// rule ([`PRE_NAMES`]), and several rules have the same regexes (llama.cpp keeps them apart
/// for their flags). llama.cpp also declares `CHATGLM3`, `LLAMA4` and `PIXTRAL`, which no name
/// selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PreTokenizer {
    Default,
    Llama3,
    DeepseekLlm,
    DeepseekCoder,
    Falcon,
    Mpt,
    Starcoder,
    Gpt2,
    Refact,
    CommandR,
    Stablelm2,
    Qwen2,
    Olmo,
    Dbrx,
    Smaug,
    Poro,
    Chatglm4,
    Viking,
    Jais,
    Tekken,
    Smollm,
    Codeshell,
    Bloom,
    Gpt3Finnish,
    Exaone,
    Chameleon,
    Minerva,
    Deepseek3Llm,
    Gpt4o,
    Superbpe,
    Trillion,
    Bailingmoe,
    SeedCoder,
    Hunyuan,
    KimiK2,
    HunyuanDense,
    Grok2,
    GraniteDocling,
    MinimaxM2,
    Afmoe,
    SolarOpen,
    Youtu,
    ExaoneMoe,
    Qwen35,
    TinyAya,
    JoyaiLlm,
    Jais2,
    Gemma4,
    SarvamMoe,
    Minicpm5,
    Whitespace,
    GraniteEmbMulti,
    Mellum2,
    Laguna,
    HyV4,
    Spark25,
    Ufakzeka,
}

// ANCHOR: regexes
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
// llama.cpp spells `(?i:'s|...)` out as ASCII classes: `(?i)` in a Unicode regex would also
// let `'ſ` (long s) and `'K` (Kelvin sign) through.
// Llama 3 and Qwen 2 differ only in their digits: runs of up to three, or one at a time.
const LLAMA3: &str = concat!(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);
const QWEN2: &str = concat!(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+",
    r"|\p{N}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);

impl PreTokenizer {
    /// llama.cpp's regexes for this rule, applied in order (`llm_tokenizer_bpe`).
    pub fn regexes(self) -> &'static [&'static str] {
        use PreTokenizer::*;
        match self {
            Gpt2 | Mpt | Olmo | Jais | Trillion | GraniteDocling => &[GPT2],
            // First every number character on its own, then GPT-2's rule between them.
            Starcoder | Refact | CommandR | Smollm | Codeshell | Exaone | Minerva | Mellum2 => {
                &[r"\p{N}", GPT2]
            }
            Llama3 | Dbrx | Smaug | Chatglm4 => &[LLAMA3],
            Stablelm2 | Qwen2 | Hunyuan | SolarOpen | Grok2 => &[QWEN2],
            // ANCHOR_END: regexes
            Default => &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            Falcon => &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
            Jais2 => &[concat!(
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+",
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)",
                r"|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)",
                r"|\s{1,2}(?!\S)|\s{1}",
            )],
            DeepseekLlm => &[
                r"[\r\n]",
                concat!(
                    r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-Ⴥ",
                    r"Ꭰ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\x{1F7D}ᾀ-ᾴᾶ-ᾼ\x{1FBE}",
                    r"ῂ-ῄῆ-ῌῐ-\x{1FD3}ῖ-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\x{2126}ℨ\x{212A}-ℭ",
                    r"ℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓",
                    r"𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
                ),
                r"\s?[!-/:-~！-／：-～‘-‟\x{3000}-。]+",
                r"\s+$",
                r"[一-龥ࠀ-一가-\x{D7FF}]+",
                r"\p{N}+",
            ],
            Deepseek3Llm | HunyuanDense | JoyaiLlm | HyV4 => &[
                r"\p{N}{1,3}",
                r"[一-龥\x{3040}-ゟ゠-ヿ]+",
                concat!(
                    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"##,
                    r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+",
                    r"|\s+(?!\S)|\s+",
                ),
            ],
            Spark25 => &[
                r"\p{N}{1,3}",
                r"[一-龥\x{3040}-ゟ゠-ヿ]+",
                concat!(
                    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"##,
                    r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
                ),
                r"\p{N}",
            ],
            Youtu => &[
                r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥\x{3040}-ゟ゠-ヿ]+",
                concat!(
                    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
                    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
                    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
                    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
                    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
                ),
            ],
            DeepseekCoder => &[
                r"[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                r"[一-龥ࠀ-一가-\x{D7FF}]+",
                r"\p{N}",
            ],
            Qwen35 => &[concat!(
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])",
                r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*",
                r"|\s*[\r\n]+|\s+(?!\S)|\s+",
            )],
            Poro | Bloom | Gpt3Finnish => &[r" ?[^(\s|.,!?…。，、।۔،)]+"],
            Viking => &[r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"],
            Tekken => &[concat!(
                r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+",
                r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*",
                r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            )],
            Chameleon => &[
                r"<sentinel:[0-9]+>",
                r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                r"([\t\n]|    |  )",
                r"\p{N}",
                r"[\p{P}!-/:-@\[-`{-~]",
                GPT2,
            ],
            Gpt4o | MinimaxM2 => &[concat!(
                r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+",
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
                r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*",
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            )],
            GraniteEmbMulti => &[concat!(
                r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+",
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
                r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*",
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            )],
            TinyAya => &[
                TINY_AYA_DIGITS,
                concat!(
                    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
                    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
                    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
                    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
                    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
                ),
            ],
            KimiK2 => &[KIMI_K2],
            Superbpe => &[r"\p{N}+", r"(?=(\d{3})+(?!\d))"],
            Bailingmoe => &[concat!(
                r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}",
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
            )],
            SeedCoder => &[concat!(
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+",
                r"|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
            )],
            Ufakzeka => &[concat!(
                r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+",
                r"|\s+(?!\S)|\s+",
            )],
            Afmoe => &[
                AFMOE_DIGITS,
                concat!(
                    r"[一-鿿㐀-䶿豈-\x{FAFF}\x{3040}-ゟ゠-ヿ･-ﾟ⼀-\x{2FDF}เ-\x{E7F}\x{E80}-\x{EFF}",
                    r"ក-\x{17FF}က-႟ꩠ-ꩿꧠ-\x{A9FF}가-\x{D7AF}ᄀ-ᇿ]+",
                ),
                concat!(
                    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"##,
                    r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+",
                    r"|\s+(?!\S)|\s+",
                ),
            ],
            Laguna => &[NEWLINES, QWEN2],
            ExaoneMoe => &[concat!(
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])",
                r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}",
                r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
            )],
            // SentencePiece-style BPE: spaces are already `▁`, only newlines cut.
            Gemma4 | SarvamMoe => &[NEWLINES],
            Minicpm5 => &[
                r"\p{N}{1,3}",
                concat!(
                    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+",
                    r"|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
                ),
            ],
            Whitespace => &[r"\S+"],
        }
    }

    /// Whether words are spelled in GPT-2's byte alphabet (`Ġthe`). The SentencePiece-style
    /// rules keep raw UTF-8, with `<0x..>` tokens for bytes.
    pub fn byte_encode(self) -> bool {
        !matches!(
            self,
            PreTokenizer::Gemma4 | PreTokenizer::SarvamMoe | PreTokenizer::Whitespace
        )
    }
}

const QWEN35: &str = concat!(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])",
    r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
);
/// Not regexes: the names by which llama.cpp picks two of its scanners.
const KIMI_K2: &str = r"\p{Han}+";
const AFMOE_DIGITS: &str = r"\p{AFMoE_digits}";
const TINY_AYA_DIGITS: &str = r"\d{1,3}(?=(?:\d{3})*\b)";
const NEWLINES: &str = r"[^\n]+|[\n]+";
const NUMBERS: &str = r"\p{N}";

/// The scanner llama.cpp runs instead of the regex engine for `expr`, if any; and one for
/// `\p{N}`, which llama.cpp does run through the engine.
fn scanner_for(expr: &str) -> Option<Scanner> {
    Some(match expr {
        GPT2 => Scanner::Gpt2,
        LLAMA3 => Scanner::Llama3 {
            max_digits: 3,
            marks: false,
        },
        QWEN2 => Scanner::Llama3 {
            max_digits: 1,
            marks: false,
        },
        QWEN35 => Scanner::Llama3 {
            max_digits: 1,
            marks: true,
        },
        KIMI_K2 => Scanner::KimiK2,
        // Tiny Aya's regex keeps llama.cpp's AFMoE scanner (llama.cpp marks it to revisit).
        AFMOE_DIGITS | TINY_AYA_DIGITS => Scanner::DigitGroups,
        NEWLINES => Scanner::Newlines,
        NUMBERS => Scanner::Numbers,
        _ => return None,
    })
}

/// One branch of llama.cpp's chain of `tokenizer.ggml.pre` names (`llama_vocab::impl::load`):
/// the rule, and the flags llama.cpp sets with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreName {
    pub names: &'static [&'static str],
    pub pre: PreTokenizer,
    /// Detokenizing removes spaces before punctuation (" ," → ","), Hugging Face's
    /// `clean_up_tokenization_spaces`.
    pub clean_spaces: bool,
    /// A word that is already a token is taken whole, without merging.
    pub ignore_merges: bool,
    /// BOS is added by default.
    pub add_bos: bool,
    /// Spaces become `▁` before splitting.
    pub escape_whitespaces: bool,
    /// No default BOS id (ChatGLM).
    pub no_bos: bool,
}

const fn row(names: &'static [&'static str], pre: PreTokenizer) -> PreName {
    PreName {
        names,
        pre,
        clean_spaces: true,
        ignore_merges: false,
        add_bos: false,
        escape_whitespaces: false,
        no_bos: false,
    }
}

impl PreName {
    const fn no_clean_spaces(self) -> PreName {
        PreName {
            clean_spaces: false,
            ..self
        }
    }
    const fn ignore_merges(self) -> PreName {
        PreName {
            ignore_merges: true,
            ..self
        }
    }
    const fn add_bos(self) -> PreName {
        PreName {
            add_bos: true,
            ..self
        }
    }
    const fn escape_whitespaces(self) -> PreName {
        PreName {
            escape_whitespaces: true,
            ..self
        }
    }
    const fn no_bos(self) -> PreName {
        PreName {
            no_bos: true,
            ..self
        }
    }
}

/// llama.cpp's table of `tokenizer.ggml.pre` names, in its order. A missing name means
/// `default` (llama.cpp warns that generation quality will suffer).
pub const PRE_NAMES: &[PreName] = {
    use PreTokenizer::*;
    &[
        row(&["default"], Default),
        row(&["minicpm5"], Minicpm5).ignore_merges(),
        row(
            &[
                "llama3",
                "llama-v3",
                "llama-bpe",
                "falcon3",
                "falcon-h1",
                "pixtral",
                "midm-2.0",
                "lfm2",
                "jina-v5-nano",
            ],
            Llama3,
        )
        .ignore_merges()
        .add_bos(),
        row(&["deepseek-llm"], DeepseekLlm).no_clean_spaces(),
        row(&["deepseek-coder"], DeepseekCoder).no_clean_spaces(),
        row(&["deepseek-v3"], Deepseek3Llm).no_clean_spaces(),
        row(&["spark2_5"], Spark25).no_clean_spaces(),
        row(&["youtu"], Youtu).no_clean_spaces().ignore_merges(),
        row(&["falcon"], Falcon),
        row(&["mpt"], Mpt),
        row(&["starcoder"], Starcoder),
        row(
            &[
                "gpt-2",
                "phi-2",
                "jina-es",
                "jina-de",
                "gigachat",
                "jina-v2-es",
                "jina-v2-de",
                "a.x-4.0",
                "mellum",
                "modern-bert",
            ],
            Gpt2,
        ),
        row(&["jais-2"], Jais2),
        row(&["gemma4", "granite-embed-multi-311m"], Gemma4).escape_whitespaces(),
        row(&["sarvam-moe"], SarvamMoe)
            .escape_whitespaces()
            .no_clean_spaces(),
        // llama.cpp also sets `add_sep` for these, which tokenizing does not use.
        row(&["jina-v1-en", "jina-v2-code", "roberta-bpe"], Gpt2),
        row(&["whitespace"], Whitespace),
        row(&["refact"], Refact),
        row(&["command-r"], CommandR).no_clean_spaces(),
        row(&["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"], Qwen2).no_clean_spaces(),
        row(&["qwen35"], Qwen35).no_clean_spaces(),
        row(&["stablelm2"], Stablelm2),
        row(&["olmo"], Olmo),
        row(&["dbrx"], Dbrx),
        row(&["smaug-bpe"], Smaug),
        row(&["poro-chat"], Poro).no_clean_spaces(),
        row(&["chatglm-bpe"], Chatglm4).no_bos(),
        row(&["glm4", "glm5"], Chatglm4).no_bos().ignore_merges(),
        row(&["viking"], Viking).no_clean_spaces(),
        row(&["jais"], Jais),
        row(&["tekken"], Tekken)
            .no_clean_spaces()
            .ignore_merges()
            .add_bos(),
        row(&["smollm"], Smollm).no_clean_spaces(),
        row(&["codeshell"], Codeshell),
        row(&["bloom"], Bloom),
        row(&["gpt3-finnish"], Gpt3Finnish),
        row(&["exaone"], Exaone),
        row(&["exaone4"], Gpt2),
        row(&["exaone-moe"], ExaoneMoe),
        row(&["chameleon"], Chameleon).add_bos().no_clean_spaces(),
        row(&["minerva-7b"], Minerva),
        row(&["megrez"], Qwen2),
        row(&["gpt-4o", "llama4", "kanana2", "talkie"], Gpt4o).no_clean_spaces(),
        row(&["granite-embed-multi-97m"], GraniteEmbMulti)
            .no_clean_spaces()
            .ignore_merges(),
        row(&["tiny_aya", "cohere2moe"], TinyAya).no_clean_spaces(),
        row(&["superbpe"], Superbpe).no_clean_spaces(),
        row(&["trillion"], Trillion).no_clean_spaces(),
        row(&["granite-docling"], GraniteDocling).no_clean_spaces(),
        row(&["bailingmoe", "bailingmoe2", "llada-moe"], Bailingmoe).no_clean_spaces(),
        row(&["seed-coder"], SeedCoder).no_clean_spaces(),
        row(&["hunyuan"], Hunyuan).no_clean_spaces(),
        row(&["hunyuan-dense"], HunyuanDense).no_clean_spaces(),
        row(&["hy_v4"], HyV4).no_clean_spaces(),
        row(&["joyai-llm"], JoyaiLlm).no_clean_spaces(),
        row(&["kimi-k2"], KimiK2).no_clean_spaces(),
        row(&["ufakzeka"], Ufakzeka).no_clean_spaces(),
        row(&["grok-2"], Grok2).no_clean_spaces(),
        row(&["afmoe"], Afmoe).no_clean_spaces(),
        row(&["laguna"], Laguna).no_clean_spaces(),
        row(&["minimax-m2"], MinimaxM2).no_clean_spaces(),
        row(&["solar-open"], SolarOpen).no_clean_spaces(),
        row(&["mellum2"], Mellum2),
    ]
};

/// The row of `tokenizer.ggml.pre` value `name`.
pub fn pre_name(name: &str) -> Option<&'static PreName> {
    PRE_NAMES.iter().find(|row| row.names.contains(&name))
}

/// A text as code points with their classes, for the scanners, and the text the regex engine
/// sees, made on first use.
pub(crate) struct Codepoints {
    chars: Vec<char>,
    classes: Vec<Class>,
    /// Byte offset of each code point, plus the text length at the end.
    offsets: Vec<usize>,
    collapsed: OnceCell<Mapped>,
    wide: OnceCell<Mapped>,
}

impl Codepoints {
    pub(crate) fn new(text: &str) -> Codepoints {
        let n = text.len();
        let mut chars = Vec::with_capacity(n);
        let mut classes = Vec::with_capacity(n);
        let mut offsets = Vec::with_capacity(n + 1);
        for (off, c) in text.char_indices() {
            chars.push(c);
            classes.push(class_of(c));
            offsets.push(off);
        }
        offsets.push(n);
        Codepoints {
            chars,
            classes,
            offsets,
            collapsed: OnceCell::new(),
            wide: OnceCell::new(),
        }
    }
    pub(crate) fn len(&self) -> usize {
        self.chars.len()
    }
}

/// One regex of a rule: a scanner or the engine.
#[derive(Debug)]
enum Step {
    Scan(Scanner),
    Regex(LlamaRegex),
}

impl Step {
    fn new(expr: &str, scanners: bool) -> Step {
        let regex = |expr| {
            LlamaRegex::new(expr)
                .unwrap_or_else(|e| panic!("llama.cpp's regex does not translate: {e}"))
        };
        match scanner_for(expr) {
            // Kimi K2's and AFMoE's "regexes" are only names: the scanner is the rule.
            Some(s) if scanners || matches!(expr, KIMI_K2 | AFMOE_DIGITS | TINY_AYA_DIGITS) => {
                Step::Scan(s)
            }
            _ => Step::Regex(regex(expr)),
        }
    }

    /// Cut `cps[range]`, pushing the end of each piece to `cuts`.
    fn cut(&self, cps: &Codepoints, range: Range<usize>, cuts: &mut Vec<usize>) {
        match self {
            Step::Scan(s) => s.scan(cps, range, cuts),
            Step::Regex(re) => {
                let text = if re.collapsed() {
                    cps.collapsed.get_or_init(|| Mapped::collapsed(cps))
                } else {
                    cps.wide.get_or_init(|| Mapped::wide(cps))
                };
                re.split(text, range, cuts);
            }
        }
    }
}

/// A rule, ready to split text: its regexes compiled or replaced by scanners.
#[derive(Debug)]
pub struct Splitter {
    pre: PreTokenizer,
    steps: Vec<Step>,
}

impl Splitter {
    /// The splitter llama.cpp runs for `pre`: scanners where it has them, else the engine.
    pub fn new(pre: PreTokenizer) -> Splitter {
        Splitter::build(pre, true)
    }

    fn build(pre: PreTokenizer, scanners: bool) -> Splitter {
        let steps = pre
            .regexes()
            .iter()
            .map(|e| Step::new(e, scanners))
            .collect();
        Splitter { pre, steps }
    }

    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }

    /// Append the byte ranges of `text`'s words to `out`. The ranges tile `text`.
    pub fn split(&self, text: &str, out: &mut Vec<Range<usize>>) {
        let cps = Codepoints::new(text);
        // The whole text is one piece before the first regex.
        let mut pieces = vec![Range {
            start: 0,
            end: cps.len(),
        }];
        let mut cuts = Vec::new();
        for step in &self.steps {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                cuts.clear();
                step.cut(&cps, piece.clone(), &mut cuts);
                // Cuts may repeat (a scanner after a full group of digits, an empty match);
                // llama.cpp skips the empty pieces, and so does this.
                let mut prev = piece.start;
                for &end in &cuts {
                    if end > prev {
                        next.push(prev..end);
                        prev = end;
                    }
                }
            }
            pieces = next;
        }
        out.extend(
            pieces
                .into_iter()
                .map(|r| cps.offsets[r.start]..cps.offsets[r.end]),
        );
    }

    /// The words of `text`, as slices of it.
    pub fn pieces<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut ranges = Vec::new();
        self.split(text, &mut ranges);
        ranges.into_iter().map(|r| &text[r]).collect()
    }
}

/// The same rules as [`Splitter`], with every regex run by the engine, also those llama.cpp
/// scans by hand (the rules whose scanner *is* the rule, Kimi K2's and the digit groups, stay).
pub struct RegexSplitter(Splitter);

impl RegexSplitter {
    pub fn new(pre: PreTokenizer) -> RegexSplitter {
        RegexSplitter(Splitter::build(pre, false))
    }

    /// Append the byte ranges of `text`'s words to `out`.
    pub fn split(&self, text: &str, out: &mut Vec<Range<usize>>) {
        self.0.split(text, out)
    }

    /// The words of `text`, as slices of it.
    pub fn pieces<'t>(&self, text: &'t str) -> Vec<&'t str> {
        self.0.pieces(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(pre: PreTokenizer, text: &str) -> Vec<&str> {
        let hand = Splitter::new(pre).pieces(text);
        let regex = RegexSplitter::new(pre).pieces(text);
        assert_eq!(
            hand, regex,
            "hand-written and regex splitters differ on {text:?}"
        );
        hand
    }

    #[test]
    fn every_rule_compiles_and_every_name_is_listed_once() {
        let mut seen = std::collections::HashSet::new();
        for row in PRE_NAMES {
            Splitter::new(row.pre);
            RegexSplitter::new(row.pre);
            for name in row.names {
                assert!(seen.insert(*name), "{name} is listed twice");
            }
        }
    }

    #[test]
    fn gpt2_words_keep_their_leading_space() {
        assert_eq!(
            both(PreTokenizer::Gpt2, "Hello world, it's 2024!"),
            ["Hello", " world", ",", " it", "'s", " 2024", "!"]
        );
    }

    #[test]
    fn whitespace_runs_leave_one_space_for_the_next_word() {
        assert_eq!(both(PreTokenizer::Gpt2, "a   b"), ["a", "  ", " b"]);
        assert_eq!(
            both(PreTokenizer::Gpt2, "a \n\n b  "),
            ["a", " \n\n", " b", "  "]
        );
    }

    #[test]
    fn smollm_isolates_every_digit() {
        assert_eq!(
            both(PreTokenizer::Smollm, "in 2024, x1"),
            ["in", " ", "2", "0", "2", "4", ",", " x", "1"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three_and_folds_contractions() {
        assert_eq!(
            both(PreTokenizer::Llama3, "1234567 WE'RE here\n\n"),
            ["123", "456", "7", " WE", "'RE", " here", "\n\n"]
        );
        assert_eq!(both(PreTokenizer::Llama3, "(x)\n y"), ["(x", ")\n", " y"]);
    }

    #[test]
    fn qwen2_takes_one_digit_at_a_time() {
        assert_eq!(
            both(PreTokenizer::Qwen2, "x 123"),
            ["x", " ", "1", "2", "3"]
        );
    }

    #[test]
    fn falcon_isolates_punctuation_and_groups_of_three_digits() {
        assert_eq!(
            both(PreTokenizer::Falcon, "a+b=12345!"),
            ["a", "+", "b", "=", "123", "45", "!"]
        );
    }

    #[test]
    fn digit_groups_count_from_the_right_and_glue_what_precedes() {
        assert_eq!(
            Splitter::new(PreTokenizer::Afmoe).pieces("ab1234567"),
            ["ab", "1", "234", "567"]
        );
    }

    #[test]
    fn collapsed_classes_cannot_tell_case_outside_ascii() {
        // GPT-4o's rule splits "HelloWorld" at the case change, but not "ÉcoleÉcole": to
        // llama.cpp's regex engine every non-ASCII letter is both upper and lower case.
        assert_eq!(
            both(PreTokenizer::Gpt4o, "HelloWorld ÉcoleÉcole"),
            ["Hello", "World", " ÉcoleÉcole"]
        );
    }
}
