(* OCaml exceptions, native code: every function of ours logs its own enter and exit, and
   each handler logs which activation it runs in, so the program itself says which frames a
   raise ended (the oracle for ptscope's stacks). The log is an int per event, written at
   exit to $PTSCOPE_OCAML_LOG: id lsl 16 lor code lsl 2 lor kind, where kind 1 is an enter
   of function names.(code), 2 an exit, 3 a handler of activation id that ran (the format
   of tests/support/oracles.py: self_log_activations). Scenarios are chosen by the
   arguments (default: all). *)

exception Found of int

let events = Array.make 200_000 0
let count = ref 0
let next_id = ref 0

(* The module's first function: perf names it by the label Ocaml_exceptions.code_begin. *)
let[@inline never] push v =
  events.(!count) <- v;
  incr count

let[@inline never] enter code =
  incr next_id;
  push ((!next_id lsl 16) lor (code lsl 2) lor 1);
  !next_id

let[@inline never] leave id = push ((id lsl 16) lor 2)
let[@inline never] caught id = push ((id lsl 16) lor 3)

let[@inline never] after () =
  let me = enter 0 in
  leave me

(* several frames deep, caught further up; the handler then calls another function *)
let[@inline never] rec dive n =
  let me = enter 1 in
  if n = 0 then raise (Found 7);
  let r = 1 + dive (n - 1) in
  leave me;
  r

let[@inline never] catcher n =
  let me = enter 2 in
  let r = try dive n with Found k -> caught me; after (); k in
  leave me;
  r

(* raised and caught in the same function *)
let[@inline never] local n =
  let me = enter 3 in
  let r = try if n > 0 then raise Exit else 0 with Exit -> caught me; after (); n in
  leave me;
  r

(* raise_notrace: a jump straight to the handler, with or without -g *)
let[@inline never] rec quiet n =
  let me = enter 4 in
  if n = 0 then raise_notrace Exit;
  let r = quiet (n - 1) in
  leave me;
  r

let[@inline never] quiet_catcher n =
  let me = enter 5 in
  let r = try quiet n with Exit -> caught me; after (); 0 in
  leave me;
  r

(* mutual recursion: odd raises at 0, the even activation that armed a try catches *)
let[@inline never] rec even n =
  let me = enter 6 in
  let r =
    if n = 3 then (try odd (n - 1) with Found k -> caught me; after (); k) else odd (n - 1)
  in
  leave me;
  r

and[@inline never] odd n =
  let me = enter 7 in
  if n = 0 then raise (Found 1);
  let r = even (n - 1) in
  leave me;
  r

(* through a List.iter closure *)
let[@inline never] visit x =
  let me = enter 8 in
  if x = 3 then raise (Found x);
  leave me

let[@inline never] iter_catcher l =
  let me = enter 9 in
  let r = try List.iter (fun x -> visit x) l; 0 with Found k -> caught me; after (); k in
  leave me;
  r

(* recursion where an older activation of the raising function catches *)
let[@inline never] rec again n =
  let me = enter 10 in
  if n = 0 then raise (Found 2);
  let r = if n = 3 then (try again (n - 1) with Found k -> caught me; after (); k) else again (n - 1) in
  leave me;
  r

(* try ... with in a loop of 10,000 iterations *)
let[@inline never] step i =
  let me = enter 11 in
  if i land 1 = 0 then raise Exit;
  leave me

let[@inline never] loop n =
  let me = enter 12 in
  for i = 1 to n do
    try step i with Exit -> caught me
  done;
  leave me

let names =
  [| "after"; "dive"; "catcher"; "local"; "quiet"; "quiet_catcher"; "even"; "odd"; "visit";
     "iter_catcher"; "again"; "step"; "loop" |]

(* Written without Printf, which would cost more instructions than all the rest: a line
   of names, then each event as a little-endian int64. *)
let write_log () =
  match Sys.getenv_opt "PTSCOPE_OCAML_LOG" with
  | None -> ()
  | Some path ->
      let buf = Bytes.create (8 * !count) in
      for i = 0 to !count - 1 do
        Bytes.set_int64_le buf (8 * i) (Int64.of_int events.(i))
      done;
      let oc = open_out_bin path in
      output_string oc (String.concat " " (Array.to_list names) ^ "\n");
      output_bytes oc buf;
      close_out oc

let () =
  let all = Array.length Sys.argv = 1 in
  let wants s = all || Array.exists (String.equal s) Sys.argv in
  let total = ref 0 in
  if wants "catcher" then total := !total + catcher 4;
  if wants "local" then total := !total + local 1;
  if wants "quiet" then total := !total + quiet_catcher 3;
  if wants "mutual" then total := !total + even 7;
  if wants "iter" then total := !total + iter_catcher [ 1; 2; 3; 4 ];
  if wants "again" then total := !total + again 5;
  if wants "loop" then loop 10_000;
  write_log ();
  Printf.printf "ocaml %d\n" !total
