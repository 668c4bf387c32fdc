"""Golden jieba segmentations for tests/test_jieba.cpp: `jieba.cut(s, cut_all=False, HMM=True)` of
jieba 0.42.1, the call LongBench's Chinese metrics make.

Cases: sentences and short spans cut from the contexts of the LongBench Chinese files, mixed
Chinese/English/digits/punctuation, made-up names (runs the dictionary does not know, so the HMM
decides), empty and whitespace-only strings, "\\r\\n", emoji and other non-Han scripts.

    pip install jieba==0.42.1
    python3 tools/reference/jieba_segment.py [LONGBENCH_DIR] > tests/fixtures/longbench/jieba_cases.json

With --compare, it instead segments the whole context of every record of multifieldqa_zh and
passage_retrieval_zh and writes one JSON line per record ({"file", "index", "segments"}) to stdout,
for comparing with the C++ segmenter on the real files (too large to keep as a fixture).
"""
import json
import logging
import os
import random
import re
import sys

import jieba

jieba.setLogLevel(logging.WARNING)
args = [a for a in sys.argv[1:] if a != "--compare"]
DIR = args[0] if args else os.path.join(os.environ.get("KVBENCH_DATA", "data"), "longbench")
FILES = ("multifieldqa_zh", "passage_retrieval_zh")


def records(name):
    with open(f"{DIR}/{name}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


if "--compare" in sys.argv[1:]:
    for name in FILES:
        for i, r in enumerate(records(name)):
            print(json.dumps({"file": name, "index": i, "segments": list(jieba.cut(r["context"], cut_all=False))},
                             ensure_ascii=False))
    sys.exit(0)

rng = random.Random(20261123)
texts = []
for name in FILES:
    for r in rng.sample(records(name), 20):
        sentences = [s for s in re.split(r"(?<=[。！？\n])", r["context"]) if s.strip()]
        texts += rng.sample(sentences, min(6, len(sentences)))
        c = r["context"]
        for _ in range(2):  # spans cut anywhere, across sentence and line boundaries
            b = rng.randrange(len(c))
            texts.append(c[b:b + rng.randrange(1, 120)])
        texts.append(r["input"][:200])

NAMES = ["欧阳娜娜", "司马懿", "诸葛亮", "王小明", "张伟", "李嘉欣", "郭靖", "黄蓉", "赵丽颖", "钱学森", "孙悟空",
         "刘德华", "陈奕迅", "马云", "周杰伦", "吴彦祖", "郑爽", "王俊凯", "易烊千玺", "迪丽热巴", "古力娜扎",
         "杨紫琼", "梁朝伟", "邓紫棋", "林俊杰", "蔡徐坤", "胡歌", "霍建华", "岳云鹏", "范冰冰"]
MADE_UP = ["柯蒂斯霍普", "贾斯汀瓦格纳", "尼古拉斯赵四", "韦小宝贝", "杭锦旗", "萨格勒布", "卡洛斯阿尔卡拉斯",
           "莫伊拉凯恩", "拉斐尔纳达尔", "淼淼鑫鑫", "喆喆垚垚", "犇犇骉骉"]
for n in NAMES + MADE_UP:
    texts += [f"{n}是一位很有名的人。", f"昨天{n}和{rng.choice(NAMES)}在北京见面了",
              f"我叫{n}，今年{rng.randrange(10, 90)}岁"]

MIXED = ["我在iPhone 15 Pro上安装了Python3.11和C++20编译器。", "GDP增长了6.5%，CPI上涨2.1%。",
         "请访问https://www.example.com/path?q=中文&x=1获取详情", "Email: test_user@example.com 联系我们",
         "AT&T和T-Mobile是美国的运营商", "B超检查结果正常", "c#和C#都是编程语言", "价格为￥1,299.00元（含税）",
         "2024年11月23日，星期六，天气晴。", "第3.14159章：π的故事", "H2O是水的化学式，CO2是二氧化碳。",
         "他说：“我们明天见！”她回答：‘好的。’", "《红楼梦》是中国古典四大名著之一。", "【重要通知】〔2024〕第12号",
         "A股、B股和H股的区别", "k8s集群部署在AWS的us-east-1区域", "版本号v1.2.3-beta.4", "1.5.3版本", "50%的人",
         "abc.12%x", "a.b", "+#&._%-", "3D打印技术", "5G网络覆盖率达到90%", "COVID-19疫情", "Wi-Fi密码是12345678",
         "这是一个测试\r\n第二行\r\n", "换行\n\n\n多个", "制表符\t分隔\t的\t文本", "全角空格　在这里", "不间断\u00a0空格",
         "零宽\u200b字符", "emoji表情😀😂👍🏻测试", "🇨🇳中国国旗", "日本語のテキストと中文混合", "한국어와 중국어",
         "Русский текст и китайский 中文", "العربية 中文", "ÄÖÜ äöü ß 中文", "繁體中文的句子測試", "龘靐齉爩",
         "\u9fd6\u9fff\u3400字", "𠀀𠀁𪚥", "々〆〇", "ＡＢＣ全角字母１２３", "①②③④⑤", "Ⅰ、Ⅱ、Ⅲ", "…………", "——",
         "", " ", "  ", "\n", "\r\n", "\t \n", "\r", "\r\r\n", "。", "，，，", "a", "1", "中", "的", "了了了了了",
         "abc", "ABC DEF", "hello world", "123 456", "3.14", "-1", "_under_score_", "##标题##", "100%纯棉",
         "x" * 50, "中" * 30, "研究生命起源", "结婚的和尚未结婚的", "南京市长江大桥", "工信处女干事每月经过下属科室都要亲口交代",
         "我来到北京清华大学", "他来到了网易杭研大厦", "小明硕士毕业于中国科学院计算所，后在日本京都大学深造",
         "永和服装饰品有限公司", "乒乓球拍卖完了", "大学生活象白纸", "吃饭了吗？没吃呢。", "他说的确实在理",
         "长春市长春节讲话", "下雨天留客天留我不留", "北京大学生前来应聘", "人要是行，干一行行一行",
         "中华人民共和国成立于1949年10月1日", "联合国教科文组织总部设在巴黎", "人工智能（AI）和机器学习（ML）",
         "深度学习框架PyTorch与TensorFlow对比", "KV缓存压缩（KV cache compression）", "SnapKV、PyramidKV和H2O方法",
         "Llama-3-8B-Instruct模型", "GPT-4o的上下文长度是128k", "第十八届年会", "美文会秘书处", "段落27", "答案是段落3"]
texts += MIXED

for _ in range(40):  # shuffled pieces of everything above
    parts = rng.sample(texts, 3)
    texts.append(rng.choice(["", " ", "，", "\n"]).join(p[: rng.randrange(1, 40)] for p in parts))

seen, cases = set(), []
for t in texts:
    if t not in seen:
        seen.add(t)
        cases.append({"text": t, "segments": list(jieba.cut(t, cut_all=False))})
print(json.dumps({"generator": "tools/reference/jieba_segment.py", "jieba": jieba.__version__, "cases": cases},
                 ensure_ascii=False, indent=0))
