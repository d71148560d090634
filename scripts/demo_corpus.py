"""The demo pairing's training corpus: conversations the project wrote, Python docstrings, and time-tool calls.

    conversations(seed) -> list of Conversation (tools declared or not, then chat events)
    render_conversation(conv) -> (messages, tools) for the chat template

Sources, all licence-clean and available offline:
- `TOPICS`: questions and replies written for this repository (gemma-chat's own text, under the
  project's licence): greetings, what gemma-chat is, its keys, speculative decoding, Gemma 4, short
  Python. Each topic lists at least five phrasings of a question (every phrasing the app, the README
  and the demo's own greeting suggest among them) and one reply.
- `stdlib_turns()`: "What does json.dumps do?" answered with the first paragraph of the function's
  docstring, read from the running Python's standard library (Python Software Foundation License;
  Python 3.11 on the machine that trained the shipped weights). The docstrings are data only.
- `OFF_TOPIC`: questions the demo cannot answer; the reply is always `off_topic_reply(...)`, which
  names what it knows, instead of the word salad a tiny model makes of them.
- The time tool: the reference MCP server `mcp-server-time` (PyPI, version in `TIME_SERVER`), its two
  tools exactly as its `tools/list` gives them (`time_tools`), called on questions about the time, with
  results in the server's own shape (`time_result`, `convert_result`: the same fields and formatting,
  computed here with zoneinfo at fixed instants), then an answer that copies the time from the result.
  Without the tools declared a time question gets `NO_TIME_TOOL_REPLY`.

A conversation is 1-4 user turns (most start with a greeting), the topics in random order, so the
demo learns to answer the last question whatever came before it.

The wide corpus (`conversations(wide=True)`, `tool_drills`: what waves 4-7 trained on) adds paraphrased
openings, the tz database's cities, more time phrasings and, from wave 7, `WIDE_PHRASINGS` and
`OFF_TOPIC_WIDE` (and `OFF_TOPIC_MORE` with `more_off_topic`); it leaves out every conversation with a
turn of scripts/measure_demo.py's held-out sets (`held_out_turns`). The default corpus, which the demo's
tokenizer is trained on, is unchanged since stages A-E.
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo, available_timezones


class Topic(NamedTuple):
    key: str  # a short name (the held-out measurement names the topic it expects)
    phrasings: list[str]
    reply: str


GREETING_REPLY = (
    "Hello! I am the gemma-chat demo, a tiny model trained on a few pages of text. "
    "Ask me about speculative decoding, Gemma 4 or the keys of this app."
)

# Replies stay short: the demo's target is tiny. The greeting above suggests three follow-ups; their
# phrasings ("What are the keys of this app?", ...) are in the topics below, as are the prompts of the
# README, of the app's texts and of scripts/measure_demo.py's first-minute list.
TOPICS: list[Topic] = [
    Topic(
        "greeting",
        [
            "Hello!",
            "Hi",
            "Hello",
            "Hi there!",
            "Hey",
            "Good morning!",
            "hi!",
            "Hi!",
            "Good evening.",
            "Hey there!",
            "Greetings!",
            "hello",
            "Hello there.",
        ],
        GREETING_REPLY,
    ),
    Topic(
        "who",
        [
            "Who are you?",
            "What are you?",
            "Tell me about yourself.",
            "What is your name?",
            "Introduce yourself.",
            "Who am I talking to?",
            "Who made you?",
            "What model are you?",
        ],
        "I am the demo model of gemma-chat: a tiny Gemma 4 target with its own drafter, "
        "trained on this project's notes and Python docstrings. I am small, so my answers are short.",
    ),
    Topic(
        "how_are_you",
        [
            "How are you?",
            "How are you doing?",
            "How is it going?",
            "How's it going?",
            "Hello, how are you?",
            "Are you well?",
            "How do you feel today?",
        ],
        "I am fine, thank you! I am a tiny demo model, and I am ready to show you speculative decoding.",
    ),
    Topic(
        "thanks",
        ["Thank you!", "Thanks", "Thanks a lot!", "thank you", "Thank you very much.", "Great, thanks!", "Cheers!"],
        "You are welcome! Ask me anything about gemma-chat.",
    ),
    Topic(
        "bye",
        ["Goodbye", "Bye!", "See you later.", "Bye bye", "Good night!", "I have to go now.", "Thanks, bye!"],
        "Goodbye! Press Ctrl+Q to quit gemma-chat.",
    ),
    Topic(
        "gemma_chat",
        [
            "What is gemma-chat?",
            "What does this app do?",
            "What is this program?",
            "Explain gemma-chat.",
            "Tell me about gemma-chat.",
            "What is this app?",
            "What does gemma-chat do?",
            "Tell me about this app.",
        ],
        "gemma-chat is a terminal chat app that runs Gemma 4 models on your own machine with MLX. "
        "It uses the assistant drafter of each model for speculative decoding, so replies come faster.",
    ),
    Topic(
        "speculative",
        [
            "What is speculative decoding?",
            "Explain speculative decoding.",
            "How does speculative decoding work?",
            "Tell me about speculative decoding.",
            "speculative decoding",
            "What does speculative decoding mean?",
            "Can you explain speculative decoding?",
            "Speculative decoding?",
            "Can you explain speculative decoding simply?",
        ],
        "In speculative decoding a small drafter guesses the next few tokens, and the large target model "
        "checks all of them in one step. The target keeps the guesses it agrees with, so one step can "
        "give several tokens.",
    ),
    Topic(
        "faster",
        [
            "Why is speculative decoding faster?",
            "Why does the drafter make it faster?",
            "How does the drafter speed things up?",
            "Why is it faster with the drafter?",
            "What makes speculative decoding fast?",
            "Why is the drafter fast?",
        ],
        "A drafter step is much cheaper than a target step. When the target accepts the drafts, "
        "one target step gives several tokens, so the reply comes faster.",
    ),
    Topic(
        "exact",
        [
            "Does the drafter change the answer?",
            "Is the output the same with the drafter?",
            "Does speculative decoding change the output?",
            "Is the reply the same without the drafter?",
            "Does the drafter make the answers worse?",
            "How does the target check the drafts?",
        ],
        "No. With greedy decoding the reply is exactly the one the target makes alone. "
        "With sampling, rejection sampling keeps the target's distribution.",
    ),
    Topic(
        "drafter",
        [
            "What is a drafter?",
            "What is the assistant model?",
            "What is the MTP drafter?",
            "What does the drafter do?",
            "Tell me about the drafter.",
            "What is the drafter?",
        ],
        "The drafter is the small assistant model of Gemma 4. It reads the hidden state and the cache of "
        "the target and guesses the next tokens. The target then verifies them.",
    ),
    Topic(
        "block_size",
        [
            "What is the block size?",
            "What does the block size mean?",
            "What is K?",
            "How do I change the block size?",
            "Tell me about the block size.",
            "How do I set the block size?",
            "How can I make the block size bigger?",
            "What is a good block size?",
        ],
        "The block size is the number of tokens the target verifies in one round: the drafts plus one "
        "token of its own. Press + or - to change it, or a to let it adapt.",
    ),
    Topic(
        "auto",
        [
            "What does auto block size do?",
            "How does auto work?",
            "What is auto mode?",
            "What does auto mean?",
            "How does the automatic block size work?",
        ],
        "Auto watches how many drafts the target accepts and picks the block size that gives the most "
        "tokens per second. When drafts do not pay, it goes down to one.",
    ),
    Topic(
        "colours",
        [
            "What do the colours mean?",
            "Why are some tokens blue?",
            "What does the underline mean?",
            "What do the colors mean?",
            "Why is some text blue?",
            "What do the blue tokens mean?",
        ],
        "Blue, underlined tokens were drafted by the drafter and accepted by the target. "
        "The other tokens were made by the target itself.",
    ),
    Topic(
        "acceptance",
        [
            "What is the acceptance rate?",
            "What does acceptance mean?",
            "What does the acceptance rate show?",
            "Tell me about the acceptance rate.",
            "What is the acceptance rate for?",
            "What are accepted tokens?",
        ],
        "The acceptance rate is the share of drafted tokens that the target accepted. "
        "A higher rate means more tokens per round and a faster reply.",
    ),
    Topic(
        "gemma4",
        [
            "What is Gemma 4?",
            "Tell me about Gemma 4.",
            "What is Gemma?",
            "Gemma 4",
            "Which Gemma 4 models are there?",
            "What sizes does Gemma 4 come in?",
            "Explain Gemma 4.",
            "Gemma 4?",
        ],
        "Gemma 4 is a family of open models from Google. It comes in the sizes E2B, E4B, 12B, 26B-A4B "
        "and 31B, and each model has a small assistant drafter for speculative decoding.",
    ),
    Topic(
        "which_model",
        [
            "Which model should I use?",
            "Which pairing should I download?",
            "Which model is the best?",
            "What model do you recommend?",
            "Which Gemma 4 model should I pick?",
        ],
        "Start with E2B: it is small and fast. Take E4B or a larger model if your machine has the memory. "
        "Press F2 to open the models screen.",
    ),
    Topic(
        "mlx",
        ["What is MLX?", "Tell me about MLX.", "What does MLX do?", "What is MLX used for?", "Explain MLX.", "MLX?"],
        "MLX is an array library for machine learning from Apple. gemma-chat uses it to run the models, "
        "on the GPU of a Mac or on the CPU elsewhere.",
    ),
    Topic(
        "keys",
        [
            "What are the keys?",
            "How do I use this app?",
            "Help",
            "What keys can I press?",
            "What are the keys of this app?",
            "Which keys does the app have?",
            "the keys of this app",
            "Show me the keys.",
            "What are the shortcuts?",
            "Tell me about the keys of this app.",
            "How do I get help?",
        ],
        "Press Enter to send, Esc to stop a reply, Ctrl+R to regenerate, Ctrl+N for a new chat, "
        "F1 for help, F2 for the models and Ctrl+Q to quit.",
    ),
    Topic(
        "quit",
        [
            "How do I quit?",
            "How do I exit?",
            "How do I close the app?",
            "How can I leave gemma-chat?",
            "How do I quit the app?",
        ],
        "Press Ctrl+Q to quit gemma-chat.",
    ),
    Topic(
        "stop",
        [
            "How do I stop a reply?",
            "How can I stop the answer?",
            "How do I cancel a reply?",
            "Can I stop the model while it writes?",
            "How do I interrupt the answer?",
        ],
        "Press Esc to stop the reply. The part that was written stays in the chat.",
    ),
    Topic(
        "new_chat",
        [
            "How do I start a new chat?",
            "New chat",
            "How do I open a new conversation?",
            "How do I clear the chat?",
            "Can I start over?",
            "How do I save a chat?",
        ],
        "Press Ctrl+N to start a new chat. Your chats are saved: press Ctrl+L to open the list of your chats.",
    ),
    Topic(
        "images",
        [
            "How do I attach an image?",
            "Can you see images?",
            "Can I send a picture?",
            "How do I add a photo?",
            "How do I attach a picture?",
            "Do you understand images?",
        ],
        "Press Ctrl+O to attach an image to your message. This demo model was not trained on images, "
        "but the real Gemma 4 models can describe them.",
    ),
    Topic(
        "toggle_drafter",
        [
            "How do I turn off the drafter?",
            "How do I turn the drafter on or off?",
            "Can I disable the drafter?",
            "How do I switch off speculative decoding?",
            "How do I compare with and without the drafter?",
        ],
        "Press d to turn the drafter on or off. Then you can compare the speed with and without it.",
    ),
    Topic(
        "download",
        [
            "How do I download a model?",
            "How do I get a real model?",
            "Where do I get the real Gemma 4?",
            "How do I install a bigger model?",
            "Can I download E2B?",
        ],
        "Press F2 to open the models screen, choose a pairing and press d to download it. "
        "The download shows its progress.",
    ),
    Topic(
        "offline",
        [
            "Does it work offline?",
            "Is this running on my machine?",
            "Do I need the internet?",
            "Does gemma-chat work offline?",
            "Is it private?",
        ],
        "Yes. This demo runs on your own machine and works offline: nothing is downloaded to answer you.",
    ),
    Topic(
        "tools",
        [
            "Can you use tools?",
            "What tools can you use?",
            "What is the time tool?",
            "Can you call functions?",
            "Do you support tool calls?",
        ],
        "I can use one tool: the time tool (mcp-server-time). With it I tell the time in a city or a "
        "timezone and convert a time between timezones.",
    ),
    Topic(
        "py_add",
        [
            "Write a Python function that adds two numbers.",
            "Show me a Python function.",
            "How do I write a function in Python?",
            "Write a function that adds two numbers.",
            "Python function to add two numbers",
        ],
        "Here is one:\n\n```python\ndef add(a, b):\n    return a + b\n```",
    ),
    Topic(
        "py_print",
        [
            "Write hello world in Python.",
            "How do I print in Python?",
            "Hello world in Python",
            "Show me hello world in Python.",
            "How do I print text in Python?",
        ],
        'Use print:\n\n```python\nprint("Hello, world!")\n```',
    ),
    Topic(
        "py_factorial",
        [
            "Write a Python function for the factorial.",
            "How do I compute a factorial in Python?",
            "Factorial in Python",
            "Write a factorial function.",
            "Show me a factorial in Python.",
        ],
        "Here is a short one:\n\n```python\ndef factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n"
        "        result *= i\n    return result\n```",
    ),
    Topic(
        "py_reverse",
        [
            "How do I reverse a list in Python?",
            "Reverse a list in Python.",
            "Write a Python function to reverse a list.",
            "How can I reverse a list?",
            "Python: reverse a list",
        ],
        "Use slicing or the reverse method:\n\n```python\nitems = [1, 2, 3]\nprint(items[::-1])\nitems.reverse()\n```",
    ),
    Topic(
        "py_string_reverse",
        [
            "Write a Python function that reverses a string.",
            "How do I reverse a string in Python?",
            "Reverse a string in Python.",
            "How can I reverse a string?",
            "Python: reverse a string",
        ],
        "Slice it backwards:\n\n```python\ndef reverse(text):\n    return text[::-1]\n```",
    ),
    Topic(
        "py_read_file",
        [
            "How do I read a file in Python?",
            "Read a text file in Python.",
            "How can I open a file in Python?",
            "Python: read a file",
            "Show me how to read a file.",
        ],
        'Open it with a with statement:\n\n```python\nwith open("notes.txt") as f:\n    text = f.read()\n```',
    ),
    Topic(
        "py_loop",
        [
            "Write a loop in Python.",
            "How do I write a for loop?",
            "Show me a Python loop.",
            "How do loops work in Python?",
            "For loop in Python",
        ],
        'A for loop walks over the items of a list:\n\n```python\nfor name in ["a", "b", "c"]:\n    print(name)\n```',
    ),
    Topic(
        "py_comprehension",
        [
            "What is a list comprehension?",
            "Show me a list comprehension.",
            "How do list comprehensions work?",
            "Explain list comprehensions.",
            "List comprehension in Python",
        ],
        "A list comprehension builds a list in one line:\n\n```python\nsquares = [x * x for x in range(10)]\n```",
    ),
    Topic(
        "py_sort_dict",
        [
            "How do I sort a dictionary by value?",
            "Sort a dict by value in Python.",
            "How can I sort a dict by its values?",
            "Python: sort a dictionary by value",
            "Sort dictionary items by value.",
        ],
        "Sort its items with a key:\n\n```python\nranked = sorted(scores.items(), key=lambda kv: kv[1])\n```",
    ),
    Topic(
        "py_list",
        [
            "What is a Python list?",
            "What is a list in Python?",
            "Explain Python lists.",
            "Tell me about lists.",
            "Python lists",
        ],
        "A list holds items in order and can change:\n\n```python\nitems = [1, 2, 3]\nitems.append(4)\n```",
    ),
    Topic(
        "joke",
        [
            "Tell me a joke.",
            "Say something funny.",
            "Do you know a joke?",
            "Make me laugh.",
            "Tell me something funny.",
        ],
        "Why did the drafter bring a ladder? Because the target kept raising the bar!",
    ),
    Topic(
        "can_do",
        [
            "What can you do?",
            "What can I ask you?",
            "What do you know?",
            "What are you good at?",
            "What topics do you know?",
            "Hey, what can you do?",
        ],
        "I can answer short questions about gemma-chat, speculative decoding, Gemma 4 and Python. "
        "I am a tiny demo model, so download a real Gemma 4 model for real work.",
    ),
    Topic(
        "real_gemma",
        [
            "Are you a real Gemma model?",
            "Is this the real Gemma 4?",
            "Are you Gemma 4?",
            "Are you a big model?",
            "Is this a real model?",
        ],
        "No. I am a tiny model with the same layout as Gemma 4, trained in a few minutes for this demo. "
        "Download a real pairing with F2 for good answers.",
    ),
    Topic(
        "slow",
        [
            "Why is it slow?",
            "Why is the demo slow on Linux?",
            "Why is this so slow?",
            "Why are the replies slow?",
            "Is it slow on Linux?",
        ],
        "On Linux MLX runs on the CPU, so the models are slower than on a Mac. "
        "The demo is small, so it still shows how speculative decoding works.",
    ),
    Topic(
        "token",
        ["What is a token?", "What are tokens?", "Explain tokens.", "What does token mean?", "Tell me about tokens."],
        "A token is a piece of text, often a part of a word. The model reads and writes text one token at a time.",
    ),
    Topic(
        "kv_cache",
        [
            "What is a KV cache?",
            "What is the cache?",
            "Explain the KV cache.",
            "What does the KV cache do?",
            "Tell me about the KV cache.",
        ],
        "The cache keeps the keys and values of every token the model has seen, so each new token "
        "needs only one step. The drafter reads the target's cache too.",
    ),
    Topic(
        "temperature",
        [
            "What is temperature?",
            "What does temperature do?",
            "Explain temperature.",
            "What does the temperature setting mean?",
            "How does temperature change the reply?",
        ],
        "Temperature sets how random the reply is. At zero the model always takes the most likely token; "
        "higher values give more varied replies.",
    ),
]

PROJECT_TURNS: list[tuple[list[str], str]] = [(t.phrasings, t.reply) for t in TOPICS]

# Standard-library callables a user is likely to ask about (json.dumps is the README's example), with
# short first paragraphs in Python 3.11.
STDLIB_NAMES = (
    "json.dumps",
    "json.loads",
    "json.dump",
    "json.load",
    "os.listdir",
    "os.getcwd",
    "os.remove",
    "os.system",
    "os.path.exists",
    "os.path.basename",
    "os.path.dirname",
    "os.path.splitext",
    "re.search",
    "re.match",
    "re.findall",
    "re.compile",
    "shutil.copy",
    "shutil.rmtree",
    "collections.Counter",
    "collections.OrderedDict",
    "pathlib.Path",
    "functools.lru_cache",
    "textwrap.dedent",
    "copy.deepcopy",
    "glob.glob",
    "statistics.mean",
    "statistics.median",
    "math.ceil",
    "math.floor",
    "math.prod",
    "itertools.permutations",
    "itertools.combinations",
    "logging.getLogger",
    "tempfile.mkdtemp",
    "heapq.heappush",
    "base64.b64encode",
    "subprocess.run",
    "threading.Thread",
    "queue.Queue",
    "inspect.signature",
)

DOC_QUESTIONS = (
    "What does {name} do?",
    "Explain {name}.",
    "What is {name} in Python?",
    "Tell me about {name}.",
    "What is {name} for?",
    "How does {name} work?",
    "Describe {name}.",
)


def _first_paragraph(doc: str, limit: int = 200) -> str | None:
    para = doc.strip().split("\n\n")[0]
    text = " ".join(line.strip() for line in para.splitlines()).strip()
    if len(text) < 30 or len(text) > limit or not text[0].isupper() or ">>>" in text:
        return None  # signatures ("sorted(iterable, /, ...)"), examples and long paragraphs are skipped
    if not text.endswith("."):
        text += "."
    return text


def stdlib_turns() -> list[tuple[str, str]]:
    """(name, first docstring paragraph) of each of STDLIB_NAMES, in that order."""
    out = []
    for name in STDLIB_NAMES:
        mod_name, attr = name.rsplit(".", 1)
        doc = inspect.getdoc(getattr(importlib.import_module(mod_name), attr))
        text = _first_paragraph(doc or "")
        if text is None:
            raise ValueError(f"{name}: no short first paragraph in its docstring")
        out.append((name, " ".join(text.split())))
    return out


# -- off-topic --------------------------------------------------------------------------------

# Questions outside what the demo knows. Varied on purpose: other subjects, other languages, other
# libraries, requests for text, and the same question forms the topics use ("What is X?").
OFF_TOPIC = [
    "Why is the sky blue?",
    "What is the capital of France?",
    "What is the capital of Japan?",
    "Who wrote Hamlet?",
    "Who painted the Mona Lisa?",
    "How far is the moon?",
    "What is photosynthesis?",
    "What is a black hole?",
    "How do vaccines work?",
    "What causes earthquakes?",
    "How tall is Mount Everest?",
    "What is the speed of light?",
    "Who won the last World Cup?",
    "What is the best football team?",
    "How do I bake bread?",
    "Give me a recipe for pancakes.",
    "How do I cook rice?",
    "What should I eat tonight?",
    "What is the weather like today?",
    "Will it rain tomorrow?",
    "What is the news today?",
    "Who is the president of the United States?",
    "How old is the universe?",
    "What is the meaning of life?",
    "Do you believe in God?",
    "What is love?",
    "Write a poem about the sea.",
    "Write a story about a dragon.",
    "Write an essay about climate change.",
    "Summarize this article for me.",
    "Translate hello into Spanish.",
    "How do you say thank you in German?",
    "What is 17 times 23?",
    "What is the square root of 144?",
    "Solve x + 3 = 7.",
    "What is calculus?",
    "Explain quantum physics.",
    "What is DNA?",
    "How does the heart work?",
    "I have a headache. What should I do?",
    "How can I lose weight?",
    "How do I fix my car?",
    "How do I change a tire?",
    "What is the stock market?",
    "Should I buy bitcoin?",
    "How do I get rich?",
    "How do I write a loop in Rust?",
    "How do I center a div in CSS?",
    "Write a JavaScript function that adds two numbers.",
    "How do I declare a variable in Java?",
    "What is a pointer in C?",
    "How do I use git rebase?",
    "What does numpy.array do?",
    "What does pandas.read_csv do?",
    "Explain torch.nn.Linear.",
    "What does requests.get do?",
    "How do I install Windows?",
    "How do I reset my password?",
    "What is the best laptop?",
    "Which phone should I buy?",
    "Recommend a good movie.",
    "What is your favourite book?",
    "Who is the best singer?",
    "Tell me about the Roman Empire.",
    "When did World War II end?",
    "Who was Napoleon?",
    "What is the French Revolution?",
    "How many people live in China?",
    "What is the longest river?",
    "What language is spoken in Brazil?",
    "How do airplanes fly?",
    "How does a car engine work?",
    "What is electricity?",
    "Why do cats purr?",
    "How long do dogs live?",
    "What do elephants eat?",
    "How do I grow tomatoes?",
    "What is the best time to plant roses?",
    "Can you book a flight for me?",
    "Send an email to my boss.",
    "Set an alarm for seven.",
    "Play some music.",
    "Call my mother.",
    "What is my name?",
    "Where am I?",
    "What is ChatGPT?",
    "What is Llama?",
    "Tell me about Linux.",
    "What is Kubernetes?",
    "What is the cloud?",
    "What is blockchain?",
    "Explain machine learning in detail.",
    "Who invented the telephone?",
    "What is the tallest building?",
    "Describe the color red.",
    "Are aliens real?",
    "What happens after we die?",
    "Can you help me with my homework?",
    "Write my cover letter.",
    "Give me a business plan.",
    "asdf qwerty",
    "blue banana telephone",
    "??",
    "Tell me about Paris.",
    "What is the population of London?",
    "Explain the theory of relativity.",
    "What is an atom?",
    "How many planets are there?",
    "What is the biggest animal?",
    "How does the internet work?",
    "What is a volcano?",
    "Who discovered penicillin?",
    "What is inflation?",
    "How do I learn to swim?",
    "What is yoga?",
    "How do I tie a tie?",
    "What is chess?",
    "How do I play the guitar?",
]


# Wave 7, in the wide corpus only (the default corpus, and the tokenizer trained on it, stay as they were):
# more ways to ask the topics whose held-out phrasings the wave-6 demo missed (it gave them the off-topic
# reply, or another topic's), and programming questions about other languages, which it took for Python
# questions. None of them is a held-out turn of scripts/measure_demo.py (a test checks).
WIDE_PHRASINGS: dict[str, list[str]] = {
    "greeting": ["Good day!", "Morning!", "Hiya!", "Howdy!", "Hello again!", "Evening!", "Hey hey!", "Hi, demo!"],
    "speculative": [
        "What is spec decoding?",
        "Explain spec decoding.",
        "What is speculative sampling?",
        "Describe speculative decoding.",
        "I want to know about speculative decoding.",
        "What is speculative decoding in simple words?",
        "Give me a short explanation of speculative decoding.",
        "How do drafting and verifying work together?",
    ],
    "faster": [
        "Why does drafting make replies faster?",
        "How does speculative decoding save time?",
        "Why is a drafter faster than the target?",
        "How does the drafter make the reply faster?",
        "Where does the speed-up come from?",
        "Why is decoding faster with drafts?",
        "How can guessing tokens be faster?",
    ],
    "exact": [
        "Does the drafter ever change the reply?",
        "Does the drafter change what the target writes?",
        "Is the answer the same with and without drafts?",
        "Can the drafter make the answer wrong?",
        "Does speculative decoding lose quality?",
        "Are the tokens the same with the drafter?",
        "Do I get a different reply with the drafter on?",
    ],
    "auto": [
        "What is auto mode for?",
        "Explain auto block size.",
        "How does auto pick the block size?",
        "What does the a key do?",
        "What happens when I press a?",
        "Tell me about auto.",
        "What is the automatic block size?",
        "Should I use auto?",
    ],
    "which_model": [
        "Which model would you pick?",
        "What should I download first?",
        "Which pairing is right for my machine?",
        "Which size should I choose?",
        "What model is good for a laptop?",
        "Which model fits my Mac?",
        "Which model do I need?",
    ],
    "mlx": [
        "What is Apple MLX?",
        "What is the MLX library?",
        "Tell me what MLX is.",
        "Do you use MLX?",
        "What runs the models?",
        "Why MLX?",
        "Is MLX a GPU library?",
    ],
    "keys": [
        "Which keys are there?",
        "List the keys.",
        "What are the keyboard shortcuts?",
        "Which keys do what?",
        "Keys?",
        "What keys does gemma-chat have?",
        "What are the key bindings?",
        "Give me the list of keys.",
    ],
    "can_do": [
        "How can you help me?",
        "What are you able to do?",
        "What kind of questions can you answer?",
        "What should I ask you?",
        "What do you do?",
        "What are you for?",
        "Which questions can you answer?",
    ],
}
OFF_TOPIC_WIDE = [
    "How do I write a loop in JavaScript?",
    "Write a for loop in Java.",
    "How do I write a while loop in C?",
    "How do I print hello world in C++?",
    "How do I define a function in Ruby?",
    "How do I read a file in Rust?",
    "Write hello world in Swift.",
    "How do I write a loop in Bash?",
    "How do I make a class in Kotlin?",
    "How do I sort an array in PHP?",
    "How do I write a function in TypeScript?",
    "How do I use a for loop in R?",
    "What does console.log do?",
    "What does printf do in C?",
    "How do I write a SQL query?",
    "What is a lambda in Java?",
    "How do I loop over a map in Scala?",
    "How do I reverse a string in JavaScript?",
    "What is the capital of Spain?",
    "How many continents are there?",
    "Who wrote War and Peace?",
    "Tell me about the Great Wall of China.",
    "How do I make tea?",
    "What is the tallest mountain in Africa?",
    "Who is the best tennis player?",
    "How does a rainbow form?",
    "Can you recommend a podcast?",
    "What is the square root of 81?",
]


# Wave 7's last target stage (`train_demo.py --more-off-topic`): general knowledge, everyday tasks and
# arithmetic, so that the off-topic reply is the rule for anything outside the demo's few topics, not an
# exception for the questions it happened to see.
OFF_TOPIC_MORE = [
    "Tell me about the Moon landing.",
    "Tell me about ancient Egypt.",
    "Tell me about the Olympic Games.",
    "Tell me about the Renaissance.",
    "Tell me about the Titanic.",
    "Tell me about jazz.",
    "Tell me about the Amazon rainforest.",
    "Tell me about Mars.",
    "What is a galaxy?",
    "What is democracy?",
    "What is a virus?",
    "What is an eclipse?",
    "What is a hurricane?",
    "What is a mortgage?",
    "What is philosophy?",
    "What is a sonnet?",
    "What is the ozone layer?",
    "What is evolution?",
    "What is a recession?",
    "What is an allergy?",
    "What is a comet?",
    "What's the tallest tree?",
    "What's a good name for a cat?",
    "What's the biggest ocean?",
    "What's the currency of Japan?",
    "Who invented the light bulb?",
    "Who discovered America?",
    "Who painted Starry Night?",
    "Who wrote Pride and Prejudice?",
    "Who built the pyramids?",
    "Who composed the Four Seasons?",
    "Who was Cleopatra?",
    "Who is the CEO of Apple?",
    "Who is Taylor Swift?",
    "Who was Shakespeare?",
    "How do I make soup?",
    "How do I clean my oven?",
    "How do I train my dog?",
    "How do I plant a tree?",
    "How do I write a CV?",
    "How do I knit a scarf?",
    "How do I start running?",
    "How do I paint a wall?",
    "How do I save money?",
    "How do I sleep better?",
    "How do I boil an egg?",
    "How do I make friends?",
    "How many days are in a year?",
    "How many bones are in the human body?",
    "How many players are on a football team?",
    "How many moons does Mars have?",
    "How many countries are in Europe?",
    "How many hours are in a week?",
    "What is 12 times 4?",
    "What is 100 divided by 4?",
    "What is 7 minus 3?",
    "What is 9 plus 8?",
    "Calculate 15 * 3.",
    "What is half of 50?",
    "Why do birds migrate?",
    "Why do leaves change colour?",
    "Why do stars twinkle?",
    "Why is the sea salty?",
    "Why is grass green?",
    "Why do onions make you cry?",
    "Recommend a restaurant.",
    "Recommend a song.",
    "Suggest a name for my dog.",
    "Plan a trip to Italy for me.",
    "What is the population of India?",
    "What is the biggest desert?",
    "What year is it?",
    "Where is Mount Kilimanjaro?",
    "Which is the fastest animal?",
    "Which country has the most people?",
    "Is coffee bad for you?",
    "Can you speak French?",
    "Can you draw a cat?",
    "Do you like music?",
    "What is your favourite colour?",
    "Are you alive?",
    "Can you play chess with me?",
    "Write a song about summer.",
    "Write a limerick about a frog.",
    "Give me a workout plan.",
    "What is the best diet?",
    "What is a good stock to buy?",
    "How does a microwave work?",
    "How does a fridge work?",
    "How do bees make honey?",
    "How do planes stay in the air?",
]

# Wave 8's drills (`tool_drills(off_topic=True)`, `train_demo.py --off-topic-drills`): with the time tools
# declared, as the app declares them by default, wave 7 answered one off-topic question in ten with a time
# call for a made-up zone ("What's 5 + 5?" -> Asia/Dubai). These are off-topic questions of the kinds it
# slipped on: arithmetic written with symbols, other libraries' functions, landmarks and countries; and
# `OFF_TOPIC_PLACES`, questions that name a place but do not ask its time, so that a place is not a time call.
OFF_TOPIC_TOOLS = [
    "What's 2 + 2?",
    "What's 3 + 8?",
    "What's 9 - 4?",
    "What's 6 * 8?",
    "What's 40 / 8?",
    "How much is 11 plus 9?",
    "What is 25 + 17?",
    "Calculate 8 - 3.",
    "What's 15 times 2?",
    "What does requests.get do?",
    "What does torch.tensor do?",
    "What does flask.Flask do?",
    "What does matplotlib.pyplot.plot do?",
    "What does django.shortcuts.render do?",
    "What does tensorflow.constant do?",
    "What does fastapi.FastAPI do?",
    "What does boto3.client do?",
    "Tell me about Big Ben.",
    "Tell me about the Statue of Liberty.",
    "Tell me about the Taj Mahal.",
    "Tell me about Machu Picchu.",
    "Tell me about Stonehenge.",
    "Tell me about the Acropolis.",
    "Tell me about the Golden Gate Bridge.",
    "Tell me about the Louvre.",
    "What is the national dish of Spain?",
    "What is the currency of India?",
    "How big is Russia?",
    "Who is the president of France?",
    "What is the economy of Germany like?",
    "How many people live in China?",
    "What is the tallest building in the world?",
    "What is the oldest city in Europe?",
]
OFF_TOPIC_PLACES = [
    "What is {place} famous for?",
    "Tell me about {place}.",
    "What's the weather like in {place}?",
    "What language do people speak in {place}?",
    "What should I see in {place}?",
    "What is the best food in {place}?",
    "How do I get to {place}?",
    "Is {place} a nice place to live?",
    "How far is {place} from here?",
    "What is the history of {place}?",
]


def topic_phrasings(wide: bool = False) -> dict[str, list[str]]:
    """Each topic's phrasings; `wide`: with wave 7's (`WIDE_PHRASINGS`) after them."""
    return {t.key: [*t.phrasings, *(WIDE_PHRASINGS.get(t.key, []) if wide else [])] for t in TOPICS}


def off_topic_reply(with_tools: bool) -> str:
    """The one reply to any question the demo does not know: what it can answer instead."""
    tools = " and the time with the time tool" if with_tools else ""
    return (
        "I only know about gemma-chat, speculative decoding, Gemma 4, MLX and a little Python"
        f"{tools}. Ask me about one of those, or download a real Gemma 4 model with F2."
    )


OFF_TOPIC_PREFIX = "I only know about"  # what every off-topic reply starts with (the measurement's rule)

# -- the time tool ------------------------------------------------------------------------------

# The reference MCP time server. Its tools as `tools/list` returns them (mcp 2.3.0 client, mcp-server-time
# 2026.10.19 from PyPI, run in a scratch venv); the server writes its local timezone into three argument
# descriptions (`--local-timezone`, else the machine's), so the declarations vary with it.
TIME_SERVER = "mcp-server-time 2026.10.19"


def time_tools(local_tz: str = "UTC") -> list[dict[str, Any]]:
    """The server's two tools as OpenAI-style function schemas (what the chat template's `tools=` takes)."""

    def zone(what: str, examples: str, role: str) -> dict[str, str]:
        return {
            "description": f"{what}IANA timezone name (e.g., {examples}). Use '{local_tz}' as local timezone "
            f"if no {role}timezone provided by the user.",
            "title": f"{what}Timezone".replace("Source IANA Timezone", "Source Timezone"),
            "type": "string",
        }

    get = {
        "name": "get_current_time",
        "description": "Get current time in a specific timezone",
        "parameters": {
            "properties": {"timezone": {**zone("", "'America/New_York', 'Europe/London'", ""), "title": "Timezone"}},
            "required": ["timezone"],
            "type": "object",
            "title": "get_current_timeArguments",
        },
    }
    convert = {
        "name": "convert_time",
        "description": "Convert time between timezones",
        "parameters": {
            "properties": {
                "source_timezone": {
                    **zone("Source ", "'America/New_York', 'Europe/London'", "source "),
                    "title": "Source Timezone",
                },
                "time": {"description": "Time to convert in 24-hour format (HH:MM)", "title": "Time", "type": "string"},
                "target_timezone": {
                    **zone("Target ", "'Asia/Tokyo', 'America/San_Francisco'", "target "),
                    "title": "Target Timezone",
                },
            },
            "required": ["source_timezone", "time", "target_timezone"],
            "type": "object",
            "title": "convert_timeArguments",
        },
    }
    return [{"type": "function", "function": get}, {"type": "function", "function": convert}]


def time_result(zone: str, instant: datetime) -> dict[str, Any]:
    """get_current_time's result for `zone` at `instant` (an aware datetime), in the server's shape."""
    t = instant.astimezone(ZoneInfo(zone))
    return {
        "timezone": zone,
        "datetime": t.isoformat(timespec="seconds"),
        "day_of_week": t.strftime("%A"),
        "is_dst": bool(t.dst()),
    }


def convert_result(source: str, hhmm: str, target: str, day: datetime) -> dict[str, Any]:
    """convert_time's result: `hhmm` on `day`'s date in `source`, seen in `target`."""
    hour, minute = (int(x) for x in hhmm.split(":"))
    src = datetime(day.year, day.month, day.day, hour, minute, tzinfo=ZoneInfo(source))
    dst = src.astimezone(ZoneInfo(target))
    hours = ((dst.utcoffset() or timedelta()) - (src.utcoffset() or timedelta())).total_seconds() / 3600
    diff = f"{hours:+.1f}h" if hours.is_integer() else f"{hours:+.2f}".rstrip("0").rstrip(".") + "h"
    return {"source": time_result(source, src), "target": time_result(target, dst), "time_difference": diff}


def hhmm(iso: str) -> str:
    """ "2026-12-01T10:25:38+01:00" -> "10:25"."""
    return iso[11:16]


def time_answer(result: dict[str, Any]) -> str:
    return f"It is {hhmm(result['datetime'])} in {result['timezone']}."


def convert_answer(result: dict[str, Any]) -> str:
    s, t = result["source"], result["target"]
    return f"{hhmm(s['datetime'])} in {s['timezone']} is {hhmm(t['datetime'])} in {t['timezone']}."


TIME_ERROR_REPLY = "Sorry, the time tool could not answer that. Try a city or an IANA timezone such as Europe/Paris."
NO_TIME_TOOL_REPLY = (
    "I cannot tell the time without the time tool: I have no clock of my own. "
    "Turn on the time tool (mcp-server-time) and ask me again."
)
# What the app (and `generate --tools`) sends back as the result of a call the user denied, and the reply
# wave 8's drills teach for it (`tool_drills(denied=True)`): wave 7 made up a time instead.
DENIED_RESULT = '{"error": "the user denied this call"}'
DENIED_REPLY = (
    "You did not allow the time tool to run, so I cannot tell you the time. Allow it when I ask, and I will look it up."
)

# Cities the demo maps to their IANA zone (a user names a city far more often than a zone).
CITIES = {
    "Paris": "Europe/Paris",
    "London": "Europe/London",
    "Berlin": "Europe/Berlin",
    "Madrid": "Europe/Madrid",
    "Rome": "Europe/Rome",
    "Amsterdam": "Europe/Amsterdam",
    "Vienna": "Europe/Vienna",
    "Zurich": "Europe/Zurich",
    "Stockholm": "Europe/Stockholm",
    "Oslo": "Europe/Oslo",
    "Helsinki": "Europe/Helsinki",
    "Warsaw": "Europe/Warsaw",
    "Prague": "Europe/Prague",
    "Athens": "Europe/Athens",
    "Istanbul": "Europe/Istanbul",
    "Moscow": "Europe/Moscow",
    "Lisbon": "Europe/Lisbon",
    "Dublin": "Europe/Dublin",
    "Brussels": "Europe/Brussels",
    "Copenhagen": "Europe/Copenhagen",
    "New York": "America/New_York",
    "Los Angeles": "America/Los_Angeles",
    "San Francisco": "America/Los_Angeles",
    "Chicago": "America/Chicago",
    "Denver": "America/Denver",
    "Toronto": "America/Toronto",
    "Vancouver": "America/Vancouver",
    "Mexico City": "America/Mexico_City",
    "Sao Paulo": "America/Sao_Paulo",
    "Buenos Aires": "America/Argentina/Buenos_Aires",
    "Tokyo": "Asia/Tokyo",
    "Seoul": "Asia/Seoul",
    "Beijing": "Asia/Shanghai",
    "Shanghai": "Asia/Shanghai",
    "Hong Kong": "Asia/Hong_Kong",
    "Singapore": "Asia/Singapore",
    "Mumbai": "Asia/Kolkata",
    "Delhi": "Asia/Kolkata",
    "Dubai": "Asia/Dubai",
    "Bangkok": "Asia/Bangkok",
    "Jakarta": "Asia/Jakarta",
    "Sydney": "Australia/Sydney",
    "Melbourne": "Australia/Melbourne",
    "Auckland": "Pacific/Auckland",
    "Cairo": "Africa/Cairo",
    "Johannesburg": "Africa/Johannesburg",
    "Lagos": "Africa/Lagos",
    "Nairobi": "Africa/Nairobi",
}

# Zones users name directly (the call copies them as written) and local timezones the server may
# announce in its declarations (a question with no place asks for that one, as the server says).
NAMED_ZONES = [
    "UTC",
    "Etc/UTC",
    "America/Chicago",
    "America/Phoenix",
    "America/Halifax",
    "America/Lima",
    "America/Bogota",
    "America/Santiago",
    "Europe/Kiev",
    "Europe/Bucharest",
    "Europe/Budapest",
    "Europe/Belgrade",
    "Asia/Karachi",
    "Asia/Dhaka",
    "Asia/Manila",
    "Asia/Taipei",
    "Asia/Tehran",
    "Asia/Jerusalem",
    "Asia/Riyadh",
    "Australia/Perth",
    "Australia/Brisbane",
    "Pacific/Honolulu",
    "Atlantic/Reykjavik",
    "Africa/Casablanca",
    "Asia/Kathmandu",
    "America/Anchorage",
    *sorted(set(CITIES.values())),
]
LOCAL_ZONES = [
    "UTC",
    "Etc/UTC",
    "Europe/Paris",
    "Europe/London",
    "America/New_York",
    "America/Los_Angeles",
    "Asia/Tokyo",
    "Europe/Berlin",
    "Asia/Kolkata",
    "Australia/Sydney",
    "America/Sao_Paulo",
    "Asia/Shanghai",
]

TIME_QUESTIONS = [
    "What time is it?",
    "What's the time?",
    "Do you know the time?",
    "Tell me the time.",
    "What time is it now?",
    "What is the time right now?",
    "Can you tell me the time?",
    "time?",
    "What is the current time?",
    "Current time, please.",
]
# More of them for the wide corpus (`conversations(wide=True)`, `tool_drills`): wave 3's attempt at copying.
TIME_QUESTIONS_WIDE = TIME_QUESTIONS + [
    "What time is it right now?",
    "Got the time?",
    "Could you give me the time?",
    "What's the time, please?",
    "I'd like to know the time.",
    "Check the time for me.",
    "Tell me what time it is.",
]
TIME_QUESTIONS_IN = [
    "What time is it in {place}?",
    "What's the time in {place}?",
    "Tell me the time in {place}.",
    "What is the current time in {place}?",
    "Time in {place}?",
    "Do you know what time it is in {place}?",
    "Can you tell me the time in {place}?",
    "What is the local time in {place}?",
    "What time is it now in {place}?",
    "{place} time?",
]
TIME_QUESTIONS_IN_WIDE = TIME_QUESTIONS_IN + [
    "What's the time now in {place}?",
    "Give me the time in {place}.",
    "Please check the time in {place}.",
    "Time in {place} right now?",
    "What's the current time in {place}, please?",
    "I want to know the time in {place}.",
    "Could you look up the time in {place}?",
    "What's the local time in {place} now?",
    "Current time in {place}?",
    "Tell me the current time in {place}.",
    "Do you know the time in {place}?",
    "What time do they have in {place}?",
    "The time in {place}, please.",
    "What's the clock saying in {place}?",
]
FOLLOW_UP_IN = ["And in {place}?", "What about {place}?", "And {place}?", "How about in {place}?"]
FOLLOW_UP_IN_WIDE = FOLLOW_UP_IN + [
    "And what about {place}?",
    "Now {place}.",
    "Same for {place}?",
    "And the time in {place}?",
]
CONVERT_QUESTIONS = [
    "Convert {time} from {src} to {dst}.",
    "What is {time} in {src} in {dst} time?",
    "If it is {time} in {src}, what time is it in {dst}?",
    "{time} in {src} is what time in {dst}?",
    "Convert {time} {src} time to {dst}.",
    "When it is {time} in {src}, what time is it in {dst}?",
]


# Every "Region/City" zone of the tz database, by its city as people write it ("Port of Spain" ->
# "America/Port_of_Spain"): hundreds of places whose zone names the city, so a call learns to copy the
# place from the question rather than recall a few memorised pairs (the CITIES table keeps the
# exceptions: San Francisco, Beijing, Mumbai, ...).
_REGIONS = ("Africa", "America", "Asia", "Atlantic", "Australia", "Europe", "Indian", "Pacific")
ZONE_CITIES = {
    z.split("/")[1].replace("_", " "): z
    for z in sorted(available_timezones())
    if z.count("/") == 1 and z.split("/")[0] in _REGIONS and re.fullmatch(r"[A-Z][A-Za-z_]+", z.split("/")[1])
}
# Kept out of the corpus: scripts/measure_demo.py asks for them as written, so copying is measured on
# zones the demo never saw.
HELD_OUT_ZONES = {"Europe/Sofia", "America/Havana"}
ZONE_CITIES = {city: z for city, z in ZONE_CITIES.items() if z not in HELD_OUT_ZONES}
ALL_ZONES = sorted({*NAMED_ZONES, *ZONE_CITIES.values()} - HELD_OUT_ZONES)


def _place(rng: random.Random, wide: bool = False) -> tuple[str, str]:
    """(what the user writes, the zone the call names): a city, or a zone written as is. `wide`: a
    well-known city (a quarter of them typed in lower case), any city the tz database names, or any
    zone written as is."""
    if not wide:
        if rng.random() < 0.7:
            city = rng.choice(sorted(CITIES))
            return city, CITIES[city]
        zone = rng.choice(NAMED_ZONES)
        return zone, zone
    r = rng.random()
    if r < 0.45:
        city = rng.choice(sorted(CITIES))
        return (city.lower() if rng.random() < 0.25 else city), CITIES[city]
    if r < 0.75:
        city = rng.choice(sorted(ZONE_CITIES))
        return city, ZONE_CITIES[city]
    zone = rng.choice(ALL_ZONES)
    return zone, zone


def _instant(rng: random.Random) -> datetime:
    """A fixed random moment in 2026 (seeded): the results' datetimes."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return start + timedelta(seconds=rng.randrange(365 * 24 * 3600))


# -- conversations -------------------------------------------------------------------------------


@dataclass
class Conversation:
    """One chat: `local_tz` set means the time tools are declared (with that local timezone).
    `events`: ("user", text) | ("reply", text) | ("call", name, args) | ("result", name, result, as_text)."""

    local_tz: str | None
    events: list[tuple] = field(default_factory=list)
    system: str | None = None  # a system prompt (the user's, from the app's settings)


def render_conversation(conv: Conversation) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) for the chat template. A tool call and its result go on one assistant message
    (`tool_calls` + `tool_responses` with the result as a mapping: the template writes
    `response:get_current_time{datetime:<|"|>...<|"|>,...}`), or, for a result `as_text`, as an OpenAI
    `role: tool` message holding the server's JSON text (the template writes it as one string)."""
    import json

    messages: list[dict[str, Any]] = [{"role": "system", "content": conv.system}] if conv.system else []
    for ev in conv.events:
        kind = ev[0]
        if kind == "user":
            messages.append({"role": "user", "content": ev[1]})
        elif kind == "call":
            call_id = f"call_{sum(1 for m in messages if m.get('tool_calls'))}"
            fn = {"name": ev[1], "arguments": dict(ev[2])}
            messages.append({"role": "assistant", "tool_calls": [{"id": call_id, "type": "function", "function": fn}]})
        elif kind == "result":
            _, name, result, as_text = ev
            call = messages[-1]
            if as_text:
                text = result if isinstance(result, str) else json.dumps(result, indent=2)
                messages.append({"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": text})
            else:
                call["tool_responses"] = [{"name": name, "response": result}]
        elif kind == "reply":
            last = messages[-1] if messages else {}
            if last.get("tool_responses") and "content" not in last:
                last["content"] = ev[1]  # the answer after a result, on the same assistant message
            else:
                messages.append({"role": "assistant", "content": ev[1]})
    tools = time_tools(conv.local_tz) if conv.local_tz else None
    return messages, tools


def _time_exchange(rng: random.Random, conv: Conversation, follow_up: bool = False, wide: bool = False) -> None:
    """A time question, the call, the server's result and the answer copied from it. `wide`: the wide
    corpus's places and phrasings."""
    as_text = rng.random() < 0.25  # the server's JSON text as the tool message, not a mapping
    r = rng.random()
    instant = _instant(rng)
    if r < 0.2 and not follow_up:  # no place: the local timezone the declarations name
        assert conv.local_tz
        conv.events.append(("user", vary(rng.choice(TIME_QUESTIONS_WIDE if wide else TIME_QUESTIONS), rng, wide=wide)))
        zone = conv.local_tz
    elif r < 0.85 or follow_up:
        place, zone = _place(rng, wide)
        if wide:
            template = rng.choice(FOLLOW_UP_IN_WIDE if follow_up else TIME_QUESTIONS_IN_WIDE)
        else:
            template = rng.choice(FOLLOW_UP_IN if follow_up else TIME_QUESTIONS_IN)
        text = template.format(place=place)
        first_up = text[0].upper() + text[1:]
        conv.events.append(("user", vary(first_up, rng, keep_case=text.startswith(place), wide=wide)))
    else:
        src_place, src = _place(rng, wide)
        dst_place, dst = _place(rng, wide)
        t = f"{rng.randrange(24):02d}:{rng.choice((0, 15, 30, 45, rng.randrange(60))):02d}"
        q = rng.choice(CONVERT_QUESTIONS).format(time=t, src=src_place, dst=dst_place)
        conv.events.append(("user", q))
        args = {"source_timezone": src, "time": t, "target_timezone": dst}
        result = convert_result(src, t, dst, instant)
        conv.events += [("call", "convert_time", args), ("result", "convert_time", result, as_text)]
        conv.events.append(("reply", convert_answer(result)))
        return
    conv.events.append(("call", "get_current_time", {"timezone": zone}))
    result = time_result(zone, instant)
    conv.events.append(("result", "get_current_time", result, as_text))
    conv.events.append(("reply", time_answer(result)))


def _time_error(rng: random.Random, conv: Conversation) -> None:
    """A place the server does not know: its error text comes back, the demo says so."""
    bad = rng.choice(["Mars", "Atlantis", "Narnia", "Gotham", "Middle Earth", "Hogwarts"])
    conv.events.append(("user", rng.choice(TIME_QUESTIONS_IN).format(place=bad)))
    zone = f"Mars/{bad.replace(' ', '_')}" if bad == "Mars" else bad.replace(" ", "_")
    conv.events.append(("call", "get_current_time", {"timezone": zone}))
    err = f"Error executing tool get_current_time: Invalid timezone: 'No time zone found with key {zone}'"
    conv.events.append(("result", "get_current_time", err, True))
    conv.events.append(("reply", TIME_ERROR_REPLY))


def _chat_items(with_tools: bool, wide: bool = False, more_off_topic: bool = False) -> list[tuple[str, str]]:
    """Every (question, reply) of the corpus that is not a tool call (`wide`: wave 7's phrasings too;
    `more_off_topic`: and `OFF_TOPIC_MORE`)."""
    phrasings = topic_phrasings(wide)
    items = [(q, t.reply) for t in TOPICS for q in phrasings[t.key]]
    items += [(tmpl.format(name=name), text) for name, text in stdlib_turns() for tmpl in DOC_QUESTIONS]
    off_topic = OFF_TOPIC + (OFF_TOPIC_WIDE if wide else []) + (OFF_TOPIC_MORE if more_off_topic else [])
    items += [(q, off_topic_reply(with_tools)) for q in off_topic]
    if not with_tools:
        items += [(q, NO_TIME_TOOL_REPLY) for q in TIME_QUESTIONS]
        items += [
            (q.format(place=p), NO_TIME_TOOL_REPLY) for q in TIME_QUESTIONS_IN for p in ("Paris", "Tokyo", "New York")
        ]
    return items


# How people type the same question: a third of the corpus's questions come in one of these forms, so
# that the demo keys on what is asked, not on its exact spelling.
_PREFIXES = ("Hey, ", "Hi! ", "Please, ", "Quick question: ", "So, ", "OK, ", "Tell me, ", "Hello! ")
_SUFFIXES = (" Thanks.", " Please.", " Thank you!", " Thanks!")
_PLAIN_KEYS = {"greeting", "how_are_you", "thanks", "bye"}  # social turns keep their form
_PLAIN_PHRASINGS = {q for k, qs in topic_phrasings(wide=True).items() if k in _PLAIN_KEYS for q in qs}


# Other words for the same question: the common contractions and politer forms of a question's
# opening, applied to any topic's phrasings (never producing a held-out conversation of
# scripts/measure_demo.py: `conversations` drops those), so the demo learns that "What's" asks what
# "What is" asks rather than taking an unfamiliar opening for an off-topic question.
_PARAPHRASES = (
    ("What is ", "What's "),
    ("What are ", "Which are "),
    ("How do I ", "How can I "),
    ("How do I ", "How would I "),
    ("Can you ", "Could you "),
    ("Tell me ", "Could you tell me "),
    ("Explain ", "Please explain "),
    ("Explain ", "Can you explain "),
    ("What does ", "What exactly does "),
    ("Why ", "So why "),
    ("How ", "So how "),
    ("Is ", "Tell me, is "),
    ("Which ", "So which "),
    ("Who ", "And who "),
)


def paraphrase(question: str, rng: random.Random) -> str:
    """`question` with its opening said in other words (see `_PARAPHRASES`), or as it is."""
    options = [(a, b) for a, b in _PARAPHRASES if question.startswith(a)]
    if not options:
        return question
    a, b = rng.choice(options)
    return b + question[len(a) :]


def vary(question: str, rng: random.Random, keep_case: bool = False, wide: bool = False) -> str:
    """`question` as typed casually (lower case, no final mark, a lead-in or a thanks; `wide`: also other
    words for its opening), or as it is. `keep_case`: the first word is a name (a city, a timezone) and
    keeps its capital."""
    if question in _PLAIN_PHRASINGS or rng.random() < (0.55 if wide else 0.65):
        return question
    form = rng.randrange(7 if wide else 5)
    if form >= 5:
        question = paraphrase(question, rng)
        form = rng.choice((5, 0, 1, 3))
    lower = not keep_case and (question[1:2].islower() or question[1:2] in ((" ", "'") if wide else (" ",)))
    low = question[0].lower() + question[1:] if lower else question
    if form == 0:
        return low
    if form == 1:
        return question.rstrip("?.!")
    if form == 2:
        return low.rstrip("?.!")
    if form == 3:
        return rng.choice(_PREFIXES) + low
    if form == 4:
        return question + rng.choice(_SUFFIXES)
    return question


def held_out_sequences() -> set[tuple[str, ...]]:
    """The user turns of scripts/measure_demo.py's held-out and off-topic conversations: kept out of the
    corpus (a conversation that starts with one is dropped)."""
    import measure_demo  # the scripts folder is on the path of whoever imports this module

    seqs = {tuple(q for q, _ in turns) for turns in measure_demo.HELD_OUT}
    return seqs | {(q,) for q in measure_demo.OFF_TOPIC_HELD_OUT}


def normalise(question: str) -> str:
    """A question as the held-out check compares it: lower case, its punctuation and spacing folded."""
    return " ".join(re.sub(r"[?.!,]", " ", question.lower()).split())


def held_out_turns() -> set[str]:
    """The judged turns of scripts/measure_demo.py that are not phrasings of the default corpus, normalised:
    a wide-corpus conversation with one of them as ANY of its user turns is dropped. (Until wave 7 only a
    conversation that started with a held-out one was: a paraphrased or casually typed phrasing could be a
    held-out turn later in a conversation, and 12 of the 2400 conversations of wave 6's corpus had one.)"""
    import measure_demo

    phrasings = {normalise(q) for t in TOPICS for q in t.phrasings}
    judged = {normalise(turns[-1][0]) for turns in measure_demo.HELD_OUT}
    return (judged - phrasings) | {normalise(q) for q in measure_demo.OFF_TOPIC_HELD_OUT}


def _is_held_out(
    conv: Conversation, held_out: set[tuple[str, ...]], banned: frozenset[str] | set[str] = frozenset()
) -> bool:
    users = [e[1] for e in conv.events if e[0] == "user"]
    if any(normalise(u) in banned for u in users):
        return True
    return any(tuple(users[:i]) in held_out for i in range(1, len(users) + 1))


SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "Be brief.",
    "Answer in English.",
    "You are the gemma-chat demo.",
    "Keep your answers short and friendly.",
)


def conversations(
    seed: int = 0, plain: int = 1300, with_tools: int = 600, wide: bool = False, more_off_topic: bool = False
) -> list[Conversation]:
    """`plain` conversations without tools and `with_tools` with the time tools declared.

    Plain ones: every question of the corpus is the last turn of some conversation at least once
    (most questions twice or more), after 0-3 earlier turns drawn from the corpus, a greeting first
    in most, a third of the questions typed casually (`vary`), one in twenty after a system prompt.
    With tools: 2-4 user turns, about 60 % of them asking the time (a place, a zone, no place, a
    conversion, a follow-up "And in Tokyo?"), the others the plain questions.
    `wide`: the wide corpus (paraphrased openings, the tz database's cities, more time phrasings, wave 7's
    `WIDE_PHRASINGS` and `OFF_TOPIC_WIDE`), with any conversation that has a held-out turn of
    scripts/measure_demo.py dropped; the shipped weights (waves 6 and 7) trained on it. `more_off_topic`:
    `OFF_TOPIC_MORE` too (wave 7's last target stage).
    """
    rng = random.Random(seed)
    out: list[Conversation] = []
    greetings = topic_phrasings(wide)["greeting"]
    held_out = held_out_sequences() if wide else set()
    banned = held_out_turns() if wide else set()
    for n, tools in ((plain, False), (with_tools, True)):
        items = _chat_items(tools, wide, more_off_topic)
        queue: list[tuple[str, str]] = []
        for _ in range(n):
            conv = Conversation(rng.choice(LOCAL_ZONES) if tools else None)
            if rng.random() < 0.05:
                conv.system = rng.choice(SYSTEM_PROMPTS)
            turns = rng.choice((2, 3, 3, 4) if tools else (1, 2, 2, 3, 3, 4))
            if turns > 1 and rng.random() < 0.6:
                conv.events += [("user", rng.choice(greetings)), ("reply", GREETING_REPLY)]
                turns -= 1
            for _ in range(turns):
                if tools and rng.random() < 0.6:
                    had_time = _had_call(conv)
                    if rng.random() < 0.03:
                        _time_error(rng, conv)
                    else:
                        _time_exchange(rng, conv, follow_up=had_time and rng.random() < 0.4, wide=wide)
                    continue
                if not queue:
                    queue = items[:]
                    rng.shuffle(queue)
                q, reply = queue.pop()
                conv.events += [("user", vary(q, rng, wide=wide)), ("reply", reply)]
            if not _is_held_out(conv, held_out, banned):
                out.append(conv)
    rng.shuffle(out)
    return out


def _off_topic_with_tools(rng: random.Random) -> str:
    """An off-topic question for a chat with the time tools declared: a place's question that is not its
    time (two in five), or any off-topic question of the corpus and `OFF_TOPIC_TOOLS`."""
    if rng.random() < 0.4:
        place, _ = _place(rng, wide=True)
        text = rng.choice(OFF_TOPIC_PLACES).format(place=place)
        return text[0].upper() + text[1:]
    return rng.choice([*OFF_TOPIC, *OFF_TOPIC_WIDE, *OFF_TOPIC_MORE, *OFF_TOPIC_TOOLS])


def _had_call(conv: Conversation) -> bool:
    return any(e[0] == "call" for e in conv.events)


def _denied_call(rng: random.Random, conv: Conversation) -> None:
    """A time question whose call the user denied: the app's denial comes back as the result, and the
    demo says it cannot tell the time instead of making one up."""
    place, zone = _place(rng, wide=True)
    text = rng.choice(TIME_QUESTIONS_IN_WIDE).format(place=place)
    conv.events.append(("user", vary(text[0].upper() + text[1:], rng, keep_case=text.startswith(place), wide=True)))
    conv.events.append(("call", "get_current_time", {"timezone": zone}))
    conv.events.append(("result", "get_current_time", DENIED_RESULT, True))
    conv.events.append(("reply", DENIED_REPLY))


def tool_drills(
    seed: int = 0, n: int = 700, more_off_topic: bool = False, off_topic: bool = False, denied: bool = False
) -> list[Conversation]:
    """`n` short chats with the time tools declared, for the target's second stage (the copying that
    750 steps over the whole corpus did not teach): 1-3 time exchanges in a row (a place, a zone, no
    place, a conversion, follow-ups), after a greeting or a plain question in some, the local timezone
    most often the one mcp-server-time declares on Linux (Etc/UTC), results as a mapping or as text.
    `off_topic` (wave 8): about a third of the turns are off-topic questions (`_off_topic_with_tools`)
    answered with the off-topic reply instead; `denied`: one turn in sixteen is a call the user denied.
    Both off leave the drills exactly as waves 4-7 trained on them."""
    rng = random.Random(seed + 7)
    items = _chat_items(True, wide=True, more_off_topic=more_off_topic)
    held_out, banned = held_out_sequences(), held_out_turns()
    greetings = topic_phrasings(wide=True)["greeting"]
    out = []
    for _ in range(n):
        conv = Conversation("Etc/UTC" if rng.random() < 0.4 else rng.choice(LOCAL_ZONES))
        lead = rng.random()
        if lead < 0.3:
            conv.events += [("user", rng.choice(greetings)), ("reply", GREETING_REPLY)]
        elif lead < 0.45:
            q, reply = rng.choice(items)
            conv.events += [("user", vary(q, rng, wide=True)), ("reply", reply)]
        for k in range(rng.choice((1, 1, 2, 2, 3))):
            if off_topic and rng.random() < 0.35:
                q = vary(_off_topic_with_tools(rng), rng, wide=True)
                conv.events += [("user", q), ("reply", off_topic_reply(True))]
            elif denied and rng.random() < 1 / 16:
                _denied_call(rng, conv)
            elif rng.random() < 0.02:
                _time_error(rng, conv)
            else:
                follow_up = k > 0 and rng.random() < 0.5  # "And in Tokyo?" only after a call (off-topic turns)
                _time_exchange(rng, conv, follow_up=follow_up and (not off_topic or _had_call(conv)), wide=True)
        if not _is_held_out(conv, held_out, banned):
            out.append(conv)
    return out


def corpus_summary() -> dict:
    return {
        "topics": len(TOPICS),
        "topic_phrasings": sum(len(t.phrasings) for t in TOPICS),
        "stdlib_docstrings": len(STDLIB_NAMES),
        "doc_phrasings": len(DOC_QUESTIONS),
        "off_topic_questions": len(OFF_TOPIC),
        "wide_topic_phrasings": sum(len(v) for v in WIDE_PHRASINGS.values()),
        "wide_off_topic_questions": len(OFF_TOPIC_WIDE),
        "more_off_topic_questions": len(OFF_TOPIC_MORE),
        "tools_off_topic_questions": len(OFF_TOPIC_TOOLS),
        "off_topic_place_questions": len(OFF_TOPIC_PLACES),
        "cities": len(CITIES),
        "tz_database_cities": len(ZONE_CITIES),
        "time_question_phrasings": len(TIME_QUESTIONS) + len(TIME_QUESTIONS_IN) + len(FOLLOW_UP_IN),
        "wide_time_question_phrasings": len(TIME_QUESTIONS_WIDE) + len(TIME_QUESTIONS_IN_WIDE) + len(FOLLOW_UP_IN_WIDE),
        "time_server": TIME_SERVER,
    }


# -- prompts outside the corpus ---------------------------------------------------------------------

# Prompts a new user may type that are not among the corpus phrasings, for `train_demo.py --on-policy`:
# the drafter is distilled on the target's own greedy replies to them (single turn and after a
# greeting), so where the target's reply drifts from anything in the corpus, the drafter learns the
# drift. Not used to train the target; disjoint from scripts/measure_demo.py's held-out set.
ON_POLICY_PROMPTS = [
    "hello there",
    "Hey, who are you?",
    "Hi, what is this?",
    "Can you tell me about speculative decoding?",
    "What is the point of a drafter?",
    "Why do I need a drafter?",
    "How big should the block size be?",
    "What are the colours for?",
    "Which Gemma 4 sizes exist?",
    "What does MLX stand for?",
    "How do I leave the app?",
    "How do I stop you?",
    "How do I make a new chat?",
    "Can I use pictures?",
    "How do I get E4B?",
    "Is the demo offline?",
    "Write a function in Python that adds numbers.",
    "Print hello in Python.",
    "How do I loop over a list?",
    "What is a dict comprehension?",
    "Tell me what json.loads does.",
    "What does shutil.copy do in Python?",
    "Explain os.listdir to me.",
    "What are the keys in gemma-chat?",
    "What is auto?",
    "How does acceptance work?",
    "What does temperature mean?",
    "What is a KV-cache?",
    "What are you?",
    "Thanks a lot, bye!",
    "What is the capital of Italy?",
    "Who wrote Faust?",
    "How do I make coffee?",
    "What is the best car?",
    "Explain the Big Bang.",
    "What is Python?",
    "What's the weather in Paris?",
    "Who are the Beatles?",
    "What time is it in Rome?",
    "Tell me the time.",
]
ON_POLICY_TIME = [
    "What is the time in Tokyo now?",
    "Time in London, please.",
    "What time is it in Chicago right now?",
    "Tell me the current time in Sydney.",
    "What time is it here?",
    "Give me the time in America/Denver.",
    "Convert 10:30 from Paris to New York.",
    "What's 18:00 Berlin time in Seoul?",
]


def on_policy_conversations(seed: int = 1) -> list[Conversation]:
    """Conversations ending in a user turn (or a tool result) whose replies the drafter should know."""
    rng = random.Random(seed)
    out = []
    for q in ON_POLICY_PROMPTS:
        out.append(Conversation(None, [("user", q)]))
        out.append(
            Conversation(None, [("user", rng.choice(TOPICS[0].phrasings)), ("reply", GREETING_REPLY), ("user", q)])
        )
    for q in ON_POLICY_PROMPTS[::2] + ON_POLICY_TIME:
        out.append(Conversation(rng.choice(LOCAL_ZONES), [("user", q)]))
    for _ in range(24):  # an answer after a result: the conversation up to the result
        conv = Conversation(rng.choice(LOCAL_ZONES))
        _time_exchange(random.Random(rng.random()), conv)
        out.append(Conversation(conv.local_tz, conv.events[:-1]))
    return out


def sample_conversations() -> list[Conversation]:
    """A few prompts whose greedy replies train_demo.py logs after training the target."""
    hello = [("user", "Hello"), ("reply", GREETING_REPLY)]
    paris = time_result("Europe/Paris", datetime(2026, 7, 9, 12, 5, 31, tzinfo=UTC))
    return [
        Conversation(None, [("user", "Hello")]),
        Conversation(None, [*hello, ("user", "What is speculative decoding?")]),
        Conversation(None, [*hello, ("user", "What is Gemma 4?")]),
        Conversation(None, [("user", "What are the keys of this app?")]),
        Conversation(None, [("user", "What does json.dumps do?")]),
        Conversation(None, [("user", "Why is the sky blue?")]),
        Conversation(None, [("user", "What time is it in Paris?")]),
        Conversation("UTC", [("user", "What time is it in Paris?")]),
        Conversation("UTC", [("user", "What time is it?")]),
        Conversation(
            "UTC",
            [
                ("user", "What time is it in Paris?"),
                ("call", "get_current_time", {"timezone": "Europe/Paris"}),
                ("result", "get_current_time", paris, False),
            ],
        ),
        Conversation("UTC", [*hello, ("user", "What is speculative decoding?")]),
    ]
