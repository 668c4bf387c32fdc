"""Golden LongBench metric scores for tests/test_longbench.cpp.

The metric wrappers follow LongBench's metrics.py (SQuAD normalisation and token F1, classification,
count, retrieval, first-line and code-line rules); ROUGE-L comes from the `rouge` 1.0.1 package and
code similarity from fuzzywuzzy 0.18.0 with python-Levenshtein, the packages the official scripts use.
The Chinese variants (qa_f1_zh, rouge_zh) segment with jieba 0.42.1 as metrics.py does.

    pip install rouge==1.0.1 fuzzywuzzy==0.18.0 python-Levenshtein jieba==0.42.1
    python3 tools/reference/longbench_metrics.py > tests/fixtures/longbench/metric_cases.json
"""
import json
import logging
import os
import random
import re
import string
import sys
from collections import Counter

import jieba
from fuzzywuzzy import fuzz
from rouge import Rouge

jieba.setLogLevel(logging.WARNING)


def normalize_answer(s):
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def token_f1(p, g):
    """metrics.py's f1_score over two token lists."""
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def qa_f1(pred, gt):
    return token_f1(normalize_answer(pred).split(), normalize_answer(gt).split())


def depth():
    """Frames on the stack of the caller, itself included."""
    frame, n = sys._getframe(1), 0
    while frame is not None:
        frame, n = frame.f_back, n + 1
    return n


def rouge_l(pred, gt, eval_depth=3):
    """metrics.py's rouge_score, with the stack headroom it has under eval.py, where it runs `eval_depth`
    frames deep (<module>, scorer, rouge_score; rouge_zh_score adds one). rouge 1.0.1 walks its LCS table
    recursively, so a long walk raises RecursionError there and the pair scores 0."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000 + depth() - eval_depth)
    try:
        return Rouge().get_scores([pred], [gt], avg=True)["rouge-l"]["f"]
    except Exception:
        return 0.0
    finally:
        sys.setrecursionlimit(limit)


def normalize_zh_answer(s):
    cn_punctuation = "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."
    all_punctuation = set(string.punctuation + cn_punctuation)
    return "".join("".join(ch for ch in s.lower() if ch not in all_punctuation).split())


def qa_f1_zh(pred, gt):
    p = [t for t in (normalize_zh_answer(x) for x in jieba.cut(pred, cut_all=False)) if len(t) > 0]
    g = [t for t in (normalize_zh_answer(x) for x in jieba.cut(gt, cut_all=False)) if len(t) > 0]
    return token_f1(p, g)


def rouge_zh(pred, gt):
    return rouge_l(" ".join(jieba.cut(pred, cut_all=False)), " ".join(jieba.cut(gt, cut_all=False)), eval_depth=4)


def classification(pred, gt, all_classes):
    matched = [c for c in all_classes if c in pred]
    for term in matched:  # removal while iterating, as the reference does
        if term in gt and term != gt:
            matched.remove(term)
    return 1.0 / len(matched) if gt in matched else 0.0


def count(pred, gt):
    nums = re.findall(r"\d+", pred)
    return sum(str(n) == str(gt) for n in nums) / len(nums) if nums else 0.0


def retrieval(pred, gt, zh):
    gid = re.findall(r"段落(\d+)" if zh else r"Paragraph (\d+)", gt)[0]
    nums = re.findall(r"\d+", pred)
    return sum(str(n) == str(gid) for n in nums) / len(nums) if nums else 0.0


def code_sim(pred, gt):
    line = ""
    for l in pred.lstrip("\n").split("\n"):
        if "`" not in l and "#" not in l and "//" not in l:
            line = l
            break
    return fuzz.ratio(line, gt) / 100


def first_line(pred):
    return pred.lstrip("\n").split("\n")[0]


rng = random.Random(20261122)
WORDS = ("the a an cat dog sat on mat Paris France capital river bank model cache token attention memory "
         "value key layer head budget The A An Dolores Park sunny day sandwich eat café naïve Zürich "
         "über 東京 北京 數學 ümlaut résumé 42 7 2024 1st").split()
PUNCT = list(".,;:!?'\"-()[]") + ["…", "“", "”", "—"]


def phrase(n):
    out = []
    for _ in range(n):
        w = rng.choice(WORDS)
        if rng.random() < 0.2:
            w += rng.choice(PUNCT)
        out.append(w)
    sep = rng.choice([" ", " ", "  ", "\t", "\n", "\u00a0", " . "])
    return sep.join(out)


def perturb(s):
    words = s.split()
    ops = rng.randrange(4)
    if ops == 0 and words:
        words = words[: rng.randrange(len(words) + 1)]
    elif ops == 1:
        words = words + phrase(rng.randrange(1, 5)).split()
    elif ops == 2 and words:
        rng.shuffle(words)
    return (" " if rng.random() < 0.7 else ".").join(words)


cases = []
fixed = [("", "Paris"), ("Paris", ""), ("The Paris.", "paris"), ("an apple a day", "apple day"),
         ("Ünïcödé Straße", "ünïcödé straße"), ("...", "a. b."), ("a", "the"), ("北京 东京", "北京")]
for p, g in fixed:
    cases.append({"metric": "qa_f1", "prediction": p, "answer": g, "score": qa_f1(p, g)})
    cases.append({"metric": "rouge", "prediction": p, "answer": g, "score": rouge_l(p, g)})
for _ in range(90):
    g = phrase(rng.randrange(1, 12))
    p = g if rng.random() < 0.15 else perturb(g) if rng.random() < 0.7 else phrase(rng.randrange(0, 15))
    cases.append({"metric": "qa_f1", "prediction": p, "answer": g, "score": qa_f1(p, g)})
for _ in range(90):
    g = ". ".join(phrase(rng.randrange(1, 10)) for _ in range(rng.randrange(1, 4)))
    p = g if rng.random() < 0.1 else perturb(g) if rng.random() < 0.7 else phrase(rng.randrange(0, 20))
    cases.append({"metric": "rouge", "prediction": p, "answer": g, "score": rouge_l(p, g)})

classes = ["Description", "Entity", "Abbreviation", "Human being", "Location", "Numeric value", "Human", "Number",
           "city", "Other location", "Entity abbreviation", "Other entity", "Other location"]
for _ in range(50):
    gt = rng.choice(classes)
    pred = rng.choice(["", gt, " ".join(rng.sample(classes, rng.randrange(1, 4))), gt + " or " + rng.choice(classes),
                       "Type: " + rng.choice(classes) + "\nmore: " + gt])
    cases.append({"metric": "classification", "prediction": pred, "answer": gt, "all_classes": classes,
                  "score": classification(pred, gt, classes)})
    fl = first_line(pred)
    cases.append({"metric": "classification_first_line", "prediction": pred, "answer": gt, "all_classes": classes,
                  "score": classification(fl, gt, classes)})
for _ in range(30):
    gt = str(rng.randrange(1, 40))
    pred = rng.choice(["", gt, f"There are {gt} unique paragraphs.", f"{gt} or {rng.randrange(1, 40)}",
                       f"I count ٣ or {gt}", "none", f"{gt}{gt}"])
    cases.append({"metric": "count", "prediction": pred, "answer": gt, "score": count(pred, gt)})
for _ in range(30):
    i = rng.randrange(1, 31)
    gt = f"Paragraph {i}"
    pred = rng.choice(["", gt, f"Paragraph {i} or Paragraph {i + 10}", f"The answer is Paragraph{i}",
                       f"Paragraph {rng.randrange(1, 31)}", "no idea"])
    cases.append({"metric": "retrieval", "prediction": pred, "answer": gt, "score": retrieval(pred, gt, False)})
    gtz = f"段落{i}"
    predz = rng.choice(["", gtz, f"答案是段落{i}", f"段落{i}或段落{i + 1}", "不知道"])
    cases.append({"metric": "retrieval_zh", "prediction": predz, "answer": gtz, "score": retrieval(predz, gtz, True)})
code = ["    return x + y", "for (int i = 0; i < n; ++i) {", "self.cache = {}", "def f(x):", "}", "x = a // b",
        "print('héllo wörld')", "    if n <= 1: return n"]
for _ in range(45):
    gt = rng.choice(code)
    pred = rng.choice(["", gt, "\n\n" + gt, "# comment\n" + gt, "```python\n" + gt + "\n```", perturb(gt),
                       "// note\n" + rng.choice(code) + "\nmore", gt[: rng.randrange(len(gt) + 1)]])
    cases.append({"metric": "code_sim", "prediction": pred, "answer": gt, "score": code_sim(pred, gt)})

# Chinese cases, from their own generator so that the cases above stay as they were.
zrng = random.Random(20261123)
ZH = ("北京 上海 中国科学院 计算所 研究 生命 起源 的 了 是 在 和 第十八届 年会 南京大学 举办 会议 总结 讨论 预算 "
      "项目 进度 问题 答案 段落 苹果 公司 发布 新款 iPhone 手机 价格 1999 元 2024 年 3.5% GDP 增长 "
      "王小明 欧阳娜娜 柯蒂斯霍普 ABC abc Python 模型 缓存 压缩").split()
ZPUNCT = ["，", "。", "！", "？", "、", "：", "；", "“", "”", "《", "》", "（", "）", "【", "】", "…", "—", ",", ".", "!",
          " ", "　", "\n", "～", "·"]


def zh_phrase(n):
    out = ""
    for _ in range(n):
        out += zrng.choice(ZH)
        if zrng.random() < 0.3:
            out += zrng.choice(ZPUNCT)
    return out


def zh_perturb(s):
    segs = list(jieba.cut(s, cut_all=False))
    op = zrng.randrange(4)
    if op == 0 and segs:
        segs = segs[: zrng.randrange(len(segs) + 1)]
    elif op == 1:
        segs += list(jieba.cut(zh_phrase(zrng.randrange(1, 4))))
    elif op == 2:
        zrng.shuffle(segs)
    else:
        segs = [x + zrng.choice(ZPUNCT) if zrng.random() < 0.3 else x for x in segs]
    return "".join(segs)


zh_fixed = [("", "北京"), ("北京", ""), ("北京", "北京"), ("北京。", "北京"), ("，。！", "北京"), ("，。！", "，。！"),
            ("…—“”", "《》"), ("南京大学", "在南京大学举办"), ("ABC abc", "abc"), ("iPhone 15", "iphone15"),
            ("   ", "\n"), ("答案是段落3", "段落3"), ("王小明和欧阳娜娜", "欧阳娜娜"), ("3.5%", "3.5%"),
            ("中国科学院计算所", "中国 科学院 计算所"), ("...", "。。。"), ("全国美国文学研究会", "全国美国文学研究会第十八届年会")]
zh_pairs = list(zh_fixed)
longbench_dir = os.path.join(os.environ.get("KVBENCH_DATA", "data"), "longbench")  # the official files
with open(f"{longbench_dir}/multifieldqa_zh.jsonl", encoding="utf-8") as f:
    real_answers = [json.loads(line)["answers"][0] for line in f if line.strip()]
for g in zrng.sample(real_answers, 30):
    zh_pairs.append((g, g))
    zh_pairs.append((zh_perturb(g), g))
    zh_pairs.append((zrng.choice(real_answers), g))
for _ in range(50):
    g = zh_phrase(zrng.randrange(1, 10))
    p = g if zrng.random() < 0.15 else zh_perturb(g) if zrng.random() < 0.7 else zh_phrase(zrng.randrange(0, 12))
    zh_pairs.append((p, g))
for p, g in zh_pairs:
    cases.append({"metric": "qa_f1_zh", "prediction": p, "answer": g, "score": qa_f1_zh(p, g)})
    cases.append({"metric": "rouge_zh", "prediction": p, "answer": g, "score": rouge_zh(p, g)})

# Long summaries at the edge of rouge's recursion: identical texts around 990 words, and reference and
# prediction sentences whose LCS walk crosses the limit partway (the walk is at most |r| + |c| - LCS steps).
lrng = random.Random(20261207)
for n in (988, 989, 990, 991, 992):
    text = " ".join(f"w{i}" for i in range(n))
    cases.append({"metric": "rouge", "prediction": text, "answer": text, "score": rouge_l(text, text)})
for _ in range(12):
    g = [f"w{lrng.randrange(300)}" for _ in range(lrng.randrange(450, 800))]
    keep = lrng.uniform(0.5, 0.95)
    p = [w for w in g if lrng.random() < keep] + [f"w{lrng.randrange(300)}" for _ in range(lrng.randrange(0, 250))]
    lrng.shuffle(p) if lrng.random() < 0.3 else None
    pred = " ".join(p) + (". short sentence" if lrng.random() < 0.4 else "")
    cases.append({"metric": "rouge", "prediction": pred, "answer": " ".join(g), "score": rouge_l(pred, " ".join(g))})
for n in (988, 989, 990, 991):  # jieba keeps these words whole: the same edge, one frame nearer
    text = " ".join(f"w{i}" for i in range(n))
    cases.append({"metric": "rouge_zh", "prediction": text, "answer": text, "score": rouge_zh(text, text)})
for _ in range(6):
    g = "".join(zrng.choice(ZH) for _ in range(zrng.randrange(700, 1200)))
    p = zh_perturb(g) if zrng.random() < 0.5 else g[: zrng.randrange(len(g) // 2, len(g))] + zh_phrase(40)
    cases.append({"metric": "rouge_zh", "prediction": p, "answer": g, "score": rouge_zh(p, g)})

print(json.dumps({"generator": "tools/reference/longbench_metrics.py", "cases": cases}, ensure_ascii=False, indent=0))
