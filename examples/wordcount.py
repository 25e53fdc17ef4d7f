"""Counts the words in a text file."""


def count_words(path):
    counts = {}
    with open(path) as f:
        for line in f:
            for word in line.split():
                counts[word] = counts.get(word, 0) + 1
    return counts


def most_common(path, n=10):
    counts = count_words(path)
    return sorted(counts.items(), key=lambda item: item[1], reverse=True)[:n]


def total_words(path):
    return sum(count_words(path).values())
