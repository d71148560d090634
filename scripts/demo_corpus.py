"""The demo pairing's training corpus: chat turns the project wrote, plus Python docstrings.

    chat_examples(seed) -> list of (user, reply) pairs

Two sources, both licence-clean and available offline:
- `PROJECT_TURNS`: questions and replies written for this repository (gemma-chat's own text,
  under the project's licence): greetings, what gemma-chat is, its keys, speculative decoding,
  Gemma 4, and short Python. Each entry lists a few phrasings of a question and one reply.
- `stdlib_turns()`: "What does json.dumps do?" answered with the first paragraph of the
  function's docstring, read from the running Python's standard library (Python Software
  Foundation License; Python 3.11 on the machine that trained the shipped weights). The
  docstrings are data only: nothing of them is executed.
"""

from __future__ import annotations

import importlib
import inspect
import random

# (phrasings of the user's message, the reply). Replies stay short: the demo's target is tiny.
PROJECT_TURNS: list[tuple[list[str], str]] = [
    (
        ["Hello!", "Hi", "Hello", "Hi there!", "Hey", "Good morning!", "Hello, how are you?", "hi!"],
        "Hello! I am the gemma-chat demo, a tiny model trained on a few pages of text. "
        "Ask me about speculative decoding, Gemma 4 or the keys of this app.",
    ),
    (
        ["Who are you?", "What are you?", "Tell me about yourself.", "What is your name?"],
        "I am the demo model of gemma-chat: a tiny Gemma 4 target with its own drafter, "
        "trained on this project's notes and Python docstrings. I am small, so my answers are short.",
    ),
    (
        ["How are you?", "How are you doing?", "How is it going?"],
        "I am fine, thank you! I am a tiny demo model, and I am ready to show you speculative decoding.",
    ),
    (
        ["Thank you!", "Thanks", "Thanks a lot!", "thank you"],
        "You are welcome! Ask me anything about gemma-chat.",
    ),
    (
        ["Goodbye", "Bye!", "See you later."],
        "Goodbye! Press Ctrl+Q to quit gemma-chat.",
    ),
    (
        ["What is gemma-chat?", "What does this app do?", "What is this program?", "Explain gemma-chat."],
        "gemma-chat is a terminal chat app that runs Gemma 4 models on your own machine with MLX. "
        "It uses the assistant drafter of each model for speculative decoding, so replies come faster.",
    ),
    (
        ["What is speculative decoding?", "Explain speculative decoding.", "How does speculative decoding work?"],
        "In speculative decoding a small drafter guesses the next few tokens, and the large target model "
        "checks all of them in one step. The target keeps the guesses it agrees with, so one step can "
        "give several tokens.",
    ),
    (
        ["Why is speculative decoding faster?", "Why does the drafter make it faster?"],
        "A drafter step is much cheaper than a target step. When the target accepts the drafts, "
        "one target step gives several tokens, so the reply comes faster.",
    ),
    (
        ["Does the drafter change the answer?", "Is the output the same with the drafter?"],
        "No. With greedy decoding the reply is exactly the one the target makes alone. "
        "With sampling, rejection sampling keeps the target's distribution.",
    ),
    (
        ["What is a drafter?", "What is the assistant model?", "What is the MTP drafter?"],
        "The drafter is the small assistant model of Gemma 4. It reads the hidden state and the cache of "
        "the target and guesses the next tokens. The target then verifies them.",
    ),
    (
        ["What is the block size?", "What does the block size mean?", "What is K?"],
        "The block size is the number of tokens the target verifies in one round: the drafts plus one "
        "token of its own. Press + or - to change it, or a to let it adapt.",
    ),
    (
        ["What does auto block size do?", "How does auto work?"],
        "Auto watches how many drafts the target accepts and picks the block size that gives the most "
        "tokens per second. When drafts do not pay, it goes down to one.",
    ),
    (
        ["What do the colours mean?", "Why are some tokens blue?", "What does the underline mean?"],
        "Blue, underlined tokens were drafted by the drafter and accepted by the target. "
        "The other tokens were made by the target itself.",
    ),
    (
        ["What is the acceptance rate?", "What does acceptance mean?"],
        "The acceptance rate is the share of drafted tokens that the target accepted. "
        "A higher rate means more tokens per round and a faster reply.",
    ),
    (
        ["What is Gemma 4?", "Tell me about Gemma 4.", "What is Gemma?"],
        "Gemma 4 is a family of open models from Google. It comes in the sizes E2B, E4B, 12B, 26B-A4B "
        "and 31B, and each model has a small assistant drafter for speculative decoding.",
    ),
    (
        ["Which model should I use?", "Which pairing should I download?"],
        "Start with E2B: it is small and fast. Take E4B or a larger model if your machine has the memory. "
        "Press F2 to open the models screen.",
    ),
    (
        ["What is MLX?", "Tell me about MLX."],
        "MLX is an array library for machine learning from Apple. gemma-chat uses it to run the models, "
        "on the GPU of a Mac or on the CPU elsewhere.",
    ),
    (
        ["What are the keys?", "How do I use this app?", "Help", "What keys can I press?"],
        "Press Enter to send, Esc to stop a reply, Ctrl+R to regenerate, Ctrl+N for a new chat, "
        "F1 for help, F2 for the models and Ctrl+Q to quit.",
    ),
    (
        ["How do I quit?", "How do I exit?"],
        "Press Ctrl+Q to quit gemma-chat.",
    ),
    (
        ["How do I stop a reply?", "How can I stop the answer?"],
        "Press Esc to stop the reply. The part that was written stays in the chat.",
    ),
    (
        ["How do I start a new chat?", "New chat"],
        "Press Ctrl+N to start a new chat. Press Ctrl+L to open the list of your chats.",
    ),
    (
        ["How do I attach an image?", "Can you see images?"],
        "Press Ctrl+O to attach an image to your message. This demo model was not trained on images, "
        "but the real Gemma 4 models can describe them.",
    ),
    (
        ["How do I turn off the drafter?", "How do I turn the drafter on or off?"],
        "Press d to turn the drafter on or off. Then you can compare the speed with and without it.",
    ),
    (
        ["How do I download a model?", "How do I get a real model?"],
        "Press F2 to open the models screen, choose a pairing and press d to download it. "
        "The download shows its progress.",
    ),
    (
        ["Write a Python function that adds two numbers.", "Show me a Python function."],
        "Here is one:\n\n```python\ndef add(a, b):\n    return a + b\n```",
    ),
    (
        ["Write hello world in Python.", "How do I print in Python?"],
        'Use print:\n\n```python\nprint("Hello, world!")\n```',
    ),
    (
        ["Write a Python function for the factorial.", "How do I compute a factorial in Python?"],
        "Here is a short one:\n\n```python\ndef factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n"
        "        result *= i\n    return result\n```",
    ),
    (
        ["How do I reverse a list in Python?", "Reverse a list in Python."],
        "Use slicing or the reverse method:\n\n```python\nitems = [1, 2, 3]\nprint(items[::-1])\nitems.reverse()\n```",
    ),
    (
        ["How do I read a file in Python?", "Read a text file in Python."],
        'Open it with a with statement:\n\n```python\nwith open("notes.txt") as f:\n    text = f.read()\n```',
    ),
    (
        ["Write a loop in Python.", "How do I write a for loop?"],
        'A for loop walks over the items of a list:\n\n```python\nfor name in ["a", "b", "c"]:\n    print(name)\n```',
    ),
    (
        ["What is a list comprehension?", "Show me a list comprehension."],
        "A list comprehension builds a list in one line:\n\n```python\nsquares = [x * x for x in range(10)]\n```",
    ),
    (
        ["How do I sort a dictionary by value?", "Sort a dict by value in Python."],
        "Sort its items with a key:\n\n```python\nranked = sorted(scores.items(), key=lambda kv: kv[1])\n```",
    ),
    (
        ["Tell me a joke.", "Say something funny."],
        "Why did the drafter bring a ladder? Because the target kept raising the bar!",
    ),
    (
        ["What can you do?", "What can I ask you?"],
        "I can answer short questions about gemma-chat, speculative decoding, Gemma 4 and Python. "
        "I am a tiny demo model, so download a real Gemma 4 model for real work.",
    ),
    (
        ["Are you a real Gemma model?", "Is this the real Gemma 4?"],
        "No. I am a tiny model with the same layout as Gemma 4, trained in a few minutes for this demo. "
        "Download a real pairing with F2 for good answers.",
    ),
    (
        ["Why is it slow?", "Why is the demo slow on Linux?"],
        "On Linux MLX runs on the CPU, so the models are slower than on a Mac. "
        "The demo is small, so it still shows how speculative decoding works.",
    ),
    (
        ["What is a token?", "What are tokens?"],
        "A token is a piece of text, often a part of a word. The model reads and writes text one token at a time.",
    ),
    (
        ["What is a KV cache?", "What is the cache?"],
        "The cache keeps the keys and values of every token the model has seen, so each new token "
        "needs only one step. The drafter reads the target's cache too.",
    ),
    (
        ["What is temperature?", "What does temperature do?"],
        "Temperature sets how random the reply is. At zero the model always takes the most likely token; "
        "higher values give more varied replies.",
    ),
]


# Standard-library modules whose public functions and classes give short, English docstrings.
STDLIB_MODULES = (
    "json",
    "os",
    "os.path",
    "shutil",
    "pathlib",
    "collections",
    "itertools",
    "functools",
    "math",
    "random",
    "statistics",
    "string",
    "textwrap",
    "re",
    "datetime",
    "time",
    "heapq",
    "bisect",
    "copy",
    "operator",
    "glob",
    "fnmatch",
    "tempfile",
    "csv",
    "base64",
    "hashlib",
    "zlib",
    "gzip",
    "difflib",
    "enum",
    "dataclasses",
    "typing",
    "inspect",
    "logging",
    "argparse",
    "subprocess",
    "threading",
    "queue",
    "contextlib",
    "urllib.parse",
    "uuid",
    "pprint",
    "calendar",
    "decimal",
    "fractions",
    "io",
    "struct",
)

_DOC_QUESTIONS = ("What does {name} do?", "Explain {name}.", "What is {name} in Python?")


def _first_paragraph(doc: str, limit: int = 200) -> str | None:
    para = doc.strip().split("\n\n")[0]
    text = " ".join(line.strip() for line in para.splitlines()).strip()
    if len(text) < 30 or len(text) > limit or not text[0].isupper() or ">>>" in text:
        return None  # signatures ("sorted(iterable, /, ...)"), examples and long paragraphs are skipped
    if not text.endswith("."):
        text += "."
    return text


def stdlib_turns() -> list[tuple[str, str]]:
    """(name, first docstring paragraph) of public callables in STDLIB_MODULES, in a fixed order."""
    out: dict[str, str] = {}
    for mod_name in STDLIB_MODULES:
        module = importlib.import_module(mod_name)
        for attr in sorted(dir(module)):
            if attr.startswith("_"):
                continue
            obj = getattr(module, attr)
            if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
                continue
            doc = inspect.getdoc(obj)
            if not doc:
                continue
            text = _first_paragraph(doc)
            name = f"{mod_name}.{attr}"
            if text and name not in out:
                out[name] = text
    return sorted(out.items())


STDLIB_SAMPLE = 40  # docstrings kept (a fixed sample): enough English, little training time


def chat_examples(seed: int = 0, project_repeats: int = 2) -> list[tuple[str, str]]:
    """(user message, reply) pairs: every phrasing of the project's turns (`project_repeats` times,
    so that the demo's own topics dominate), then one question per documented stdlib callable."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    for _ in range(project_repeats):
        for questions, reply in PROJECT_TURNS:
            out += [(q, reply) for q in questions]
    docs = stdlib_turns()
    for name, text in sorted(rng.sample(docs, min(STDLIB_SAMPLE, len(docs)))):
        out.append((rng.choice(_DOC_QUESTIONS).format(name=name), text))
    rng.shuffle(out)
    return out


# Prompts a new user types that are not among the corpus phrasings. `train_demo.py --on-policy` distils the
# drafter on the target's own greedy replies to them (and to the corpus prompts): where the target's reply
# drifts from anything in the corpus, the drafter learns the drift. Not used to train the target.
ON_POLICY_PROMPTS = [
    "hello there",
    "Hey, what can you do?",
    "Who made you?",
    "What model are you?",
    "Can you explain speculative decoding simply?",
    "Why is the drafter fast?",
    "How does the target check the drafts?",
    "What does gemma-chat do?",
    "Tell me about this app.",
    "How can I make the block size bigger?",
    "How do I set the block size?",
    "What is a good block size?",
    "How do I turn off the drafter?",
    "What do the blue tokens mean?",
    "What is the acceptance rate for?",
    "Which Gemma 4 models are there?",
    "What sizes does Gemma 4 come in?",
    "Which model is the best?",
    "What is MLX used for?",
    "Which keys does the app have?",
    "How do I attach a picture?",
    "How do I save a chat?",
    "How do I get help?",
    "Write a Python function that adds two numbers.",
    "Write a Python function to reverse a list.",
    "Show me a Python loop.",
    "How do I read a file in Python?",
    "Write hello world in Python.",
    "What does os.path.join do?",
    "What does sorted do in Python?",
    "Explain json.loads.",
    "What is a Python list?",
    "Thanks, bye!",
    "Are you a big model?",
    "Is this running on my machine?",
    "Does it work offline?",
]


def corpus_summary() -> dict:
    project = sum(len(q) for q, _ in PROJECT_TURNS)
    return {
        "project_turns": len(PROJECT_TURNS),
        "project_phrasings": project,
        "stdlib_docstrings": min(STDLIB_SAMPLE, len(stdlib_turns())),
        "stdlib_modules": len(STDLIB_MODULES),
    }
