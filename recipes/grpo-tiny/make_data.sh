#!/bin/sh
# grpo-tiny's data (committed; rerun to regenerate, byte for byte): every single-digit sum a+b.
#   data/sft.jsonl      chat records {"messages": [user "a+b=", assistant "c"]}: the format stage 1 teaches
#   data/prompts.jsonl  the same 100 questions as GRPO prompts {"messages": [user "a+b="], "answer": "c"}
# Plain POSIX sh, no randomness: the order is a fixed stride through the 100 pairs (37 is prime
# to 100), so neither file lists the sums in order.
set -eu
cd "$(dirname "$0")"
mkdir -p data
: > data/sft.jsonl
: > data/prompts.jsonl
i=0
while [ $i -lt 100 ]; do
  k=$(( (i * 37 + 11) % 100 ))
  a=$(( k / 10 )) b=$(( k % 10 ))
  c=$(( a + b ))
  printf '{"messages": [{"role": "user", "content": "%d+%d="}, {"role": "assistant", "content": "%d"}]}\n' $a $b $c >> data/sft.jsonl
  printf '{"messages": [{"role": "user", "content": "%d+%d="}], "answer": "%d"}\n' $a $b $c >> data/prompts.jsonl
  i=$(( i + 1 ))
done
