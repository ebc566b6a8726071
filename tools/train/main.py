"""Entry point of the embedded-model pipeline (run on the GPU machine; see models/README.md).

  python3 tools/train/main.py prepare  --data DIR [--tokenizer-from FOLDER] [--dry]
  python3 tools/train/main.py train    --model tiny|draft|moe|eagle3 --data DIR [--dry] [--init-from HEAD]
  python3 tools/train/main.py evaluate --model tiny|draft|moe|eagle3 --data DIR [--dry]
  python3 tools/train/main.py fixtures --models tiny,draft,moe,eagle3 [--data DIR]

`prepare` builds the corpus, trains the tokenizer (or reuses the one in --tokenizer-from) and
tokenizes the corpus; `train` trains one model and writes models/<name>/ plus
tools/train/results/<name>.train.json; `evaluate` writes tools/train/results/<name>.eval.json;
`fixtures` writes tests/fixtures/embedded/. eagle3 (the EAGLE-3 head of specula-tiny, eagle3.py)
needs models/specula-tiny to train, models/specula-tiny-draft too to evaluate (it is compared with
the draft), and the validation stream of --data for its fixture's prompts.
"""
import argparse
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from common import log  # noqa: E402
from configs import NAMES  # noqa: E402


def results_path(kind, what, dry):
    folder = os.path.join(REPO, "tools", "train", "results" if not dry else "results-dry")
    return os.path.join(folder, f"{NAMES[kind]}.{what}.json")


def cmd_prepare(args):
    from data import write_streams
    from source_corpus import collect, training_text
    from tokenizer_build import check_with_transformers, save_tokenizer, train_tokenizer

    max_bytes = 256_000_000
    train, val, stats = collect(max_bytes, max_files=4000 if args.dry else None, log=log)
    tok_dir = os.path.join(args.data, "tokenizer")
    if args.tokenizer_from:
        from tokenizers import Tokenizer

        os.makedirs(tok_dir, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(args.tokenizer_from, name), os.path.join(tok_dir, name))
        tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        log(f"tokenizer: reused {args.tokenizer_from}")
    else:
        tok = train_tokenizer((d.text for d in train), log=log)
        save_tokenizer(tok, tok_dir)
    try:
        check_with_transformers(tok_dir, log=log)
    except Exception as e:  # reported loudly; a dry run goes on to show the other stages
        log(f"TOKENIZER CHECK FAILED: {type(e).__name__}: {e}")
        if not args.dry:
            raise
    write_streams(tok, train, val, stats, args.data, log=log)
    # A peek at what the models read.
    chat = next((d for d in train if d.is_chat), None)
    if chat:
        log("example chat-wrapped document start: " + repr(training_text(chat)[:300]))


def cmd_train(args):
    from train import train

    out = os.path.join(REPO, "models", NAMES[args.model]) if not args.out else args.out
    teacher = os.path.join(REPO, "models", NAMES["tiny"]) if args.model in ("draft", "eagle3") else None
    if args.model == "eagle3":
        from eagle3 import train_eagle3

        train_eagle3(args.data, out, results_path(args.model, "train", args.dry), teacher, dry=args.dry,
                     init_from=args.init_from)
        return
    train(args.model, args.data, out, os.path.join(args.data, "tokenizer"), results_path(args.model, "train", args.dry),
          dry=args.dry, teacher_dir=teacher)


def cmd_evaluate(args):
    if args.model == "eagle3":
        from eagle3 import evaluate_eagle3

        evaluate_eagle3(os.path.join(REPO, "models"), args.data, results_path(args.model, "eval", args.dry),
                        dry=args.dry)
        return
    from evaluate import evaluate

    evaluate(args.model, os.path.join(REPO, "models"), args.data, results_path(args.model, "eval", args.dry),
             dry=args.dry)


def cmd_fixtures(args):
    from fixtures import add_greedy_margins, make_fixtures

    kinds = args.models.split(",")
    out_root = os.path.join(REPO, "tests", "fixtures", "embedded")
    if args.add_greedy_margins:
        add_greedy_margins(kinds, os.path.join(REPO, "models"), out_root, args.add_greedy_margins)
        return
    others = [k for k in kinds if k != "eagle3"]
    if others:
        make_fixtures(others, os.path.join(REPO, "models"), out_root)
    if "eagle3" in kinds:
        from eagle3 import make_fixture

        make_fixture(os.path.join(REPO, "models"), out_root, args.data)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--data", required=True)
    p.add_argument("--tokenizer-from")
    p.add_argument("--dry", action="store_true")
    for name in ("train", "evaluate"):
        p = sub.add_parser(name)
        p.add_argument("--model", choices=sorted(NAMES), required=True)
        p.add_argument("--data", required=True)
        p.add_argument("--dry", action="store_true")
        if name == "train":
            p.add_argument("--out")
            p.add_argument("--init-from", help="eagle3: go on training this saved head")
    p = sub.add_parser("fixtures")
    p.add_argument("--models", default="tiny,draft,moe")
    p.add_argument("--data", default="/tmp/specula_data", help="its val.npy gives eagle3's fixture prompts")
    p.add_argument("--add-greedy-margins", metavar="OUT_DIR",
                   help="only add greedy_margin_i to the existing fixtures, written under OUT_DIR")
    args = ap.parse_args()
    {"prepare": cmd_prepare, "train": cmd_train, "evaluate": cmd_evaluate, "fixtures": cmd_fixtures}[args.cmd](args)


if __name__ == "__main__":
    main()
