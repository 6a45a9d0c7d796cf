"""Templates and vocabularies of the prompt families.

Each family is a function ``(rng) -> str`` producing one prompt from templates filled with varied
entities and numbers. The vocabularies are deliberately broad so the drafter sees many surface forms.
"""

from __future__ import annotations

import random

NAMES = ["Alice", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kira",
         "Liam", "Maya", "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera",
         "Wen", "Ximena", "Yusuf", "Zoe", "Mr. Lopez", "Ms. Chen", "a baker", "a farmer", "a teacher"]
ITEMS = ["apples", "pencils", "marbles", "books", "stickers", "cookies", "eggs", "shirts", "cards",
         "bottles", "tickets", "flowers", "stamps", "coins", "cupcakes", "toy cars", "notebooks", "oranges"]
UNITS = [("kilometers", "hour"), ("miles", "hour"), ("meters", "minute"), ("pages", "day"),
         ("liters", "minute"), ("words", "minute")]

MATH_TEMPLATES = [
    "{n} has {a} {item}. {n2} gives {pron} {b} more. How many {item} does {n} have now?",
    "{n} had {a} {item} and gave away {c} of them. How many are left?",
    "A box holds {a} {item}. How many {item} are in {b} boxes?",
    "{n} shares {p} {item} equally among {d} friends. How many does each friend get?",
    "A shop sells {item} for ${price} each. How much do {b} {item} cost?",
    "A car travels at {a} {u0} per {u1}. How far does it go in {d} {u1}s?",
    "{n} reads {a} pages a day. How many days does it take to read a book of {p} pages?",
    "A rectangle is {a} cm long and {b} cm wide. What is its area and its perimeter?",
    "{n} saves ${a} every week. How much money does {n} save in {d} weeks?",
    "A class has {a} students. {pct}% of them are girls. How many girls are in the class?",
    "What is {a} + {b} * {d}? Explain the order of operations.",
    "{n} bought {b} {item} at ${price} each and paid with a ${bill} bill. How much change did {n} get?",
    "A train leaves at {h}:00 and the trip takes {d} hours and {m} minutes. When does it arrive?",
    "The sum of two numbers is {a} and their difference is {d}. What are the numbers?",
    "A recipe needs {d} eggs for {b} people. How many eggs are needed for {a} people?",
    "Solve for x: {d}x + {b} = {lin}.",
    "What is {pct}% of {p}?",
    "{n} ran {d} laps of a {a}-meter track. How many kilometers did {n} run?",
    "A tank holds {p} liters and is filled at {a} liters per minute. How long does it take to fill?",
    "The average of {d} numbers is {a}. What is their sum?",
]

CODE_LANGS = ["Python", "Python", "Python", "JavaScript", "C", "Java", "Go", "Rust", "TypeScript", "C++"]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the vowels in a string", "finds the largest element of a list", "sorts a list with bubble sort",
    "computes the factorial of a number", "checks whether a string is a palindrome",
    "removes duplicates from a list", "merges two sorted lists", "computes the greatest common divisor of two numbers",
    "converts Celsius to Fahrenheit", "counts how often each word appears in a text", "flattens a nested list",
    "returns the sum of the digits of an integer", "implements binary search", "checks whether two strings are anagrams",
    "finds the second largest number in a list", "converts a decimal number to binary", "validates an email address",
    "returns the average of a list of numbers", "capitalizes the first letter of every word",
    "rotates a list by k positions", "computes the power set of a list", "transposes a matrix",
    "finds the longest word in a sentence", "checks whether a year is a leap year", "generates the first n prime numbers",
    "reads a file and counts its lines", "implements a stack with push and pop", "computes the dot product of two vectors",
    "returns the median of a list", "converts a Roman numeral to an integer", "finds all pairs in a list that sum to a target",
]
CODE_TEMPLATES = [
    "Write a {lang} function that {task}.",
    "Write a short {lang} program that {task}, with a comment on each step.",
    "How do I write a function in {lang} that {task}?",
    "Show me a {lang} example of a function that {task} and explain how it works.",
    "Explain what the following Python code does:\n\n{snippet}",
    "What is the difference between {cc1} and {cc2} in {lang}?",
    "Explain the concept of {concept} in programming with a small {lang} example.",
]
CODE_SNIPPETS = [
    "def f(xs):\n    return [x * x for x in xs if x % 2 == 0]",
    "total = 0\nfor i in range(1, {a}):\n    total += i\nprint(total)",
    "def g(s):\n    return s == s[::-1]",
    "d = {{}}\nfor w in text.split():\n    d[w] = d.get(w, 0) + 1",
    "x = sorted(data, key=lambda p: p[1], reverse=True)[:{d}]",
    "while n > 0:\n    digits.append(n % 10)\n    n //= 10",
]
CODE_CONCEPTS = ["recursion", "a hash map", "a linked list", "a closure", "an iterator", "exception handling",
                 "a class", "inheritance", "a queue", "unit testing", "string formatting", "a dictionary",
                 "list comprehension", "a for loop", "variable scope", "immutability"]
CODE_PAIRS = [("a list", "a tuple"), ("a for loop", "a while loop"), ("== ", "is"), ("a function", "a method"),
              ("an array", "a linked list"), ("a class", "an object"), ("break", "continue")]

CHAT_TOPICS = ["photosynthesis", "gravity", "the water cycle", "inflation", "vaccines", "black holes",
               "the internet", "climate change", "electricity", "DNA", "volcanoes", "the stock market",
               "machine learning", "the immune system", "earthquakes", "rainbows", "the moon's phases",
               "democracy", "supply and demand", "evolution", "the greenhouse effect", "sound waves",
               "the human heart", "tides", "solar energy", "recycling", "the Roman Empire", "the printing press",
               "sleep", "memory", "bacteria", "magnets", "clouds", "the seasons", "compound interest",
               "renewable energy", "the solar system", "antibiotics", "nutrition", "friction",
               "the French Revolution", "photosynthesis in the ocean", "the speed of light", "plate tectonics",
               "taxes", "the Industrial Revolution", "coral reefs", "the Olympic Games", "batteries", "airplanes flying",
               "the food chain", "nuclear energy", "the human brain", "bees", "glaciers", "credit scores",
               "the Great Wall of China", "electric cars", "meditation", "the periodic table"]
CHAT_PAIRS = [("weather", "climate"), ("a virus", "a bacterium"), ("speed", "velocity"), ("a star", "a planet"),
              ("mass", "weight"), ("an atom", "a molecule"), ("a lake", "a sea"), ("saving", "investing"),
              ("a simile", "a metaphor"), ("a comet", "an asteroid"), ("RAM", "storage"), ("a cold", "the flu")]
CHAT_AUDIENCES = ["a child", "a high school student", "a beginner", "my grandmother", "someone new to science"]
CHAT_TEMPLATES = [
    "Explain {topic} in simple terms.",
    "What is {topic}?",
    "Can you explain {topic} to {aud}?",
    "Why is {topic} important?",
    "What is the difference between {x} and {y}?",
    "Tell me three interesting facts about {topic}.",
    "How does {topic} work?",
    "Hi! I'm curious about {topic}. Where should I start?",
    "What are the pros and cons of {topic}?",
    "Give a short summary of {topic}.",
]

INSTR_FORMS = ["poem", "haiku", "short story", "email", "product description", "tweet", "speech", "letter",
               "slogan", "limerick", "paragraph", "diary entry"]
INSTR_SUBJECTS = ["autumn", "a rainy day", "a lost cat", "friendship", "the ocean", "a new bakery", "a job interview",
                  "a trip to the mountains", "learning to cook", "a robot", "the first day of school", "coffee",
                  "a city at night", "a garden", "a birthday party", "a library", "winter", "a dragon"]
INSTR_ACTIVITIES = ["better sleep", "studying for exams", "saving money", "staying productive at home", "learning a language",
                    "running a marathon", "public speaking", "reducing stress", "eating healthier", "traveling on a budget",
                    "writing a resume", "keeping plants alive", "making friends in a new city", "time management"]
INSTR_SENTENCES = ["The meeting was moved to Thursday because the manager was sick.",
                   "I can't believe how fast the summer went by.", "Our team finished the project ahead of schedule.",
                   "The restaurant was crowded but the food was worth the wait.",
                   "She forgot her umbrella and got soaked on the way home.",
                   "Please send me the report by the end of the day."]
INSTR_TEMPLATES = [
    "Write a {form} about {subject}.",
    "Give me {k} tips for {activity}.",
    "List {k} ideas for {activity}.",
    "Rewrite this sentence in a more formal tone: \"{sentence}\"",
    "Translate this sentence into French: \"{sentence}\"",
    "Summarize this sentence in five words: \"{sentence}\"",
    "Write a {form} for {name} about {subject}.",
    "Make a step-by-step plan for {activity}.",
    "Write a title and a two-sentence description for a blog post about {subject}.",
    "Describe {subject} using three adjectives and explain each.",
]


def math_prompt(rng: random.Random) -> str:
    n, n2 = rng.sample(NAMES, 2)
    u0, u1 = rng.choice(UNITS)
    d = rng.randint(2, 12)
    b = rng.randint(2, 30)
    x = rng.randint(1, 20)
    return rng.choice(MATH_TEMPLATES).format(
        n=n, n2=n2, pron="them", item=rng.choice(ITEMS), a=rng.randint(3, 90), b=b,
        c=rng.randint(1, 3), d=d, p=d * rng.randint(3, 40), price=rng.randint(1, 15),
        bill=rng.choice([20, 50, 100]) + 0 * b, u0=u0, u1=u1, pct=rng.choice([10, 20, 25, 40, 50, 60, 75]),
        h=rng.randint(1, 11), m=rng.choice([10, 15, 20, 30, 45]), lin=d * x + b)


def code_prompt(rng: random.Random) -> str:
    lang = rng.choice(CODE_LANGS)
    cc1, cc2 = rng.choice(CODE_PAIRS)
    snippet = rng.choice(CODE_SNIPPETS).format(a=rng.randint(5, 100), d=rng.randint(2, 10))
    return rng.choice(CODE_TEMPLATES).format(lang=lang, task=rng.choice(CODE_TASKS), snippet=snippet,
                                             cc1=cc1.strip(), cc2=cc2, concept=rng.choice(CODE_CONCEPTS))


CHAT_SUFFIXES = ["", "", "", " Keep it short.", " Use an example.", " Please answer in a few sentences.",
                 " Explain it step by step.", " Use an analogy."]


def chat_prompt(rng: random.Random) -> str:
    x, y = rng.choice(CHAT_PAIRS)
    body = rng.choice(CHAT_TEMPLATES).format(topic=rng.choice(CHAT_TOPICS), aud=rng.choice(CHAT_AUDIENCES), x=x, y=y)
    return body + rng.choice(CHAT_SUFFIXES)


def instruction_prompt(rng: random.Random) -> str:
    return rng.choice(INSTR_TEMPLATES).format(
        form=rng.choice(INSTR_FORMS), subject=rng.choice(INSTR_SUBJECTS), activity=rng.choice(INSTR_ACTIVITIES),
        k=rng.randint(3, 7), sentence=rng.choice(INSTR_SENTENCES), name=rng.choice(NAMES))


GENERATORS = {"math": math_prompt, "code": code_prompt, "chat": chat_prompt, "instructions": instruction_prompt}
